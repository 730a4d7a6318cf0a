"""Retrieval inside training: top-k from the newest published index.

It runs on the host, between the input pipeline and the train step. The query
is embedded on the devices with the current parameters, searched in the index
the builder published (exact search on the devices, or ScaNN on the host),
and the candidates' token ids are gathered from corpus arrays held in host
memory: at paper scale they are 13M x 288 wordpieces, more than an
accelerator holds. The step then recomputes the candidates' embeddings and
p(z|x) with the current parameters, so gradients reach both towers.
docs/training.md measures the share of a step this takes.
"""


import functools
import logging

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from realm_jax import distributed, errors, run_directory
from realm_jax.data import block_store, masked_queries
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.index.client import IndexClient
from realm_jax.index.embed import DocumentEmbedder, local_share
from realm_jax.models.candidates import (NULL_DOCUMENT_ID, gather_blocks,
                                         null_document, select_candidates)
from realm_jax.models.retriever import Retriever
from realm_jax.training import partitioning

log = logging.getLogger(__name__)


class CandidateRetrieval:
  """Candidates of a batch of queries, from the corpus and its newest index.

  Attributes:
    retriever: the towers' module; queries are embedded with it on `mesh`.
    num_candidates: k, the null document included when `null_document_first`.
    null_document_first: the empty document at candidate 0 (pre-training).
    exclude_source: drop each query's own block, the trivial candidate.
    block_length: wordpieces kept of each candidate block (None: all 288);
      shorter blocks make the document tower cheaper on small machines.
  """

  def __init__(self, model_dir: str, corpus_dir: str, retriever: Retriever,
               mesh, num_candidates: int, null_document_first: bool,
               exclude_source: bool, cls_id: int, sep_id: int,
               block_length: int | None = None):
    self.model_dir, self.corpus_dir = model_dir, corpus_dir
    self.retriever, self.mesh = retriever, mesh
    opened = OpenCorpus(corpus_dir)
    self.corpus_metadata = opened.metadata
    self.num_candidates = num_candidates
    self.null_document_first = null_document_first
    # Blocks fetched from the index per query: 0 when the null document is
    # the only candidate (the reader without retrieval needs no index).
    self.fetch = num_candidates - int(null_document_first)
    self.exclude_source = exclude_source
    self.store = opened.store()
    self.blocks = self.store.padded(
        block_length or self.corpus_metadata['max_block_length'])
    self.null = {k: np.asarray(v) for k, v in null_document(
        self.blocks['token_ids'].shape[1], cls_id, sep_id).items()}
    # This process's devices only: each process searches its own queries.
    self.client = IndexClient(model_dir, self.corpus_metadata,
                              retriever.projection_size,
                              devices=jax.local_devices(),
                              block_length=block_length)
    data = partitioning.batch_sharding(mesh)
    self._embed_query = jax.jit(
        lambda params, query: retriever.apply(
            {'params': params}, query['token_ids'], query['input_mask'],
            query['token_type_ids'], method='embed_query'),
        in_shardings=(None, data), out_shardings=data)
    self._null_embedding = None  # (index step, [D]): see candidate_embeddings.

  def candidate_embeddings(self, ids, retriever_params) -> np.ndarray:
    """[B, k, D] the served index's rows of block ids [B, k], the null
    document's (NULL_DOCUMENT_ID) embedded by the document tower of
    `retriever_params`: the embeddings that tower gives them, where it is
    the one that embedded the index (frozen towers; a step scored with its
    own index)."""
    step = self.client.index_step
    if self._null_embedding is None or self._null_embedding[0] != step:
      keys = ('token_ids', 'input_mask', 'token_type_ids')
      null = self.retriever.apply(
          {'params': retriever_params}, *(self.null[k][None] for k in keys),
          method='embed_documents')
      self._null_embedding = (step, np.asarray(null[0], np.float32))
    ids = np.asarray(ids)
    return np.where((ids == NULL_DOCUMENT_ID)[..., None],
                    self._null_embedding[1],
                    self.client.document_embeddings(ids))

  def query_embeddings(self, retriever_params, query: dict) -> np.ndarray:
    """This process's rows of the queries' embeddings, on the devices."""
    embedded = self._embed_query(retriever_params,
                                 partitioning.global_batch(query, self.mesh))
    return partitioning.local_rows(embedded, self.mesh)

  def _publish(self, step: int, retriever_params) -> None:
    """Publishes the index of `step`. One older than the newest is
    published by a manager that prunes nothing (one that keeps the last 3
    would delete a newer index for it); it stays beside them until a
    publication that prunes."""
    index_dir = run_directory.index_dir(self.model_dir)
    log.info('embedding the corpus with the step-%d retriever into %s', step,
             index_dir)
    newest = self.client.newest_step()
    newest = distributed.agree(-1 if newest is None else newest)
    unpruned = {'max_to_keep': None} if step < newest else {}
    try:
      publication.embed_and_publish(
          publication.index_manager(index_dir, **unpruned), step,
          DocumentEmbedder(self.retriever), retriever_params,
          local_share(self.blocks), self.corpus_metadata)
    except ocp.checkpoint_manager.StepAlreadyExistsError:
      pass  # An index builder beside us published the same step first.

  def _warm_start_embeddings(self, source_dir: str, source_step: int):
    """Another run's index of `source_step`, or None when it has none that
    fits this corpus and block cut."""
    directory = run_directory.index_dir(source_dir)
    if not epath.Path(directory).is_dir():
      return None
    source = publication.index_manager(directory, read_only=True)
    if source_step not in run_directory.reload(source):
      return None
    metadata = publication.read_metadata(source, source_step)
    if metadata is None:
      return None
    try:
      publication.check_compatible(metadata, self.corpus_metadata,
                                   self.client.dim, directory,
                                   self.client.block_length)
    except errors.IndexMismatchError as error:
      log.info("not reusing the warm start's index: %s", error)
      return None
    return publication.read_embeddings(source, source_step)

  def _copy(self, step: int, embeddings, source_dir: str,
            source_step: int) -> None:
    """Publishes the warm start's embeddings as our `step`, naming the
    checkpoint whose towers embedded them (`corpus_sync` reads it)."""
    metadata = publication.index_metadata(
        self.corpus_metadata, embeddings, step, 'exact',
        self.client.block_length)
    metadata[publication.EMBEDDED_BY] = {'model_dir': source_dir,
                                         'step': int(source_step)}
    try:
      publication.publish(
          publication.index_manager(run_directory.index_dir(self.model_dir)),
          step, embeddings, metadata)
    except ocp.checkpoint_manager.StepAlreadyExistsError:
      pass
    log.info("index step %d: the warm start's index (step %d of %s), "
             'embedded by the same parameters', step, source_step, source_dir)

  def ensure_index(self, step: int, retriever_params,
                   warm_start: tuple[str, int] | None = None) -> None:
    """Without any published index, publishes one as `step`: the warm-start
    run's index of the step we started from (`warm_start`: its model_dir and
    step; the same parameters embedded it), or else the corpus embedded with
    the current towers, as the index builder would."""
    self.client.maybe_refresh()
    # Publishing is collective: every process follows process 0's view.
    if distributed.agree(self.client.searcher is None):
      embeddings = warm_start and self._warm_start_embeddings(*warm_start)
      if distributed.everyone(embeddings is not None):
        self._copy(step, embeddings, *warm_start)
      else:
        self._publish(step, retriever_params)
    self.client.maybe_refresh()
    if self.client.searcher is None:
      raise RuntimeError(
          f'No index in {run_directory.index_dir(self.model_dir)} after '
          f'publishing step {step}.')

  def index_at(self, step: int, retriever_params) -> None:
    """Serves the index of exactly `step`, embedding it if none was published
    (evaluating a retriever, not the stale index it trained with), and keeps
    it: a newer index published meanwhile is not swapped in. A step older
    than the newest index (a kept checkpoint scored after the run) is
    served as well, its index published beside the newer ones (see
    `_publish`)."""
    self.client.follow = False
    if not self.fetch:
      return
    # The newest first: after a corpus sync it holds this step's towers'
    # embeddings of the corpus as it is now, under a step of its own.
    self.client.maybe_refresh(force=True)
    if self.client.params_step != step:
      self.client.serve(step)
    if distributed.agree(self.client.params_step != step):
      self._publish(step, retriever_params)
    if self.client.params_step != step:  # Published now, or seen late here.
      self.client.serve(step)
    if self.client.params_step != step:
      raise RuntimeError(
          f'{run_directory.index_dir(self.model_dir)} serves the index of '
          f'step {self.client.params_step}, not the evaluated step {step}.')

  @functools.cached_property
  def articles(self) -> np.ndarray:
    """Each block's article, read once a warm start draws from them."""
    return self.store.articles()

  def siblings(self, block_ids, rng: np.random.Generator) -> np.ndarray:
    """[B] another block of each block's article, drawn at random, or
    NULL_DOCUMENT_ID where the article is that block alone."""
    return block_store.draw_siblings(self.articles, block_ids, rng,
                                     NULL_DOCUMENT_ID)

  def span_holders(self, block_ids, targets, target_mask,
                   rng: np.random.Generator, fallback=None) -> np.ndarray:
    """[B] `masked_queries.draw_holders` of the queries: a block of each
    one's article that holds its masked span, else `fallback` or its own."""
    return masked_queries.draw_holders(
        self.articles, lambda ids: self.blocks_of(ids)['token_ids'],
        block_ids, targets, target_mask, rng, NULL_DOCUMENT_ID, fallback)

  def blocks_of(self, ids):
    """[B, k] block ids (NULL_DOCUMENT_ID for none) -> their token arrays."""
    return gather_blocks(self.blocks, np.asarray(ids), self.null, xp=np)

  def candidates(self, query_embeddings, source_ids):
    """(blocks [B, k, L] token arrays, candidate_mask [B, k], ids [B, k]).

    `source_ids` [B] are the queries' own blocks (the trivial candidates).
    """
    return self.dispatch_candidates(query_embeddings, source_ids)()

  def dispatch_candidates(self, query_embeddings, source_ids,
                          step: int | None = None):
    """`candidates` in two parts: the look for a newer index (the one for
    trainer `step`, see `IndexClient.refresh_for`) and the search's device
    work now; the returned function does the host's share (the search's
    result, the candidate list, the gather from host memory)."""
    exclude = (np.asarray(source_ids) if self.exclude_source else
               np.full(len(query_embeddings), NULL_DOCUMENT_ID))
    if self.fetch:
      self.client.refresh_for(step)
      searched = self.client.dispatch(query_embeddings, self.fetch, exclude)
    else:  # The null document alone: the reader without retrieval.
      empty = np.zeros((len(query_embeddings), 0), np.int32)
      searched = lambda: (None, empty)

    def host_part():
      _, ids = searched()
      if self.null_document_first:
        ids, mask = select_candidates(ids, exclude, self.num_candidates,
                                      xp=np)
      else:
        mask = ids >= 0
      return self.blocks_of(ids), mask, ids
    return host_part
