"""The index builder (`realm-jax refresh`): a separate process beside training.

It polls the trainer's checkpoints through a read-only Orbax manager; for each
newer step it restores only the retriever's parameters, re-embeds every block
with the document tower, builds the searcher and publishes the index under
model_dir/index with the trainer step as its step. It exits when the trainer
marks training done and the last step is published. A checkpoint the trainer
prunes while it is listed or read is skipped (see `steps`), never fatal.
"""

import time

import gin
import jax
from etils import epath

from realm_jax import distributed
from realm_jax.data import corpus
from realm_jax.index import publication, steps
from realm_jax.index.embed import (DocumentEmbedder, embed_corpus,
                                   local_block_arrays)
from realm_jax.index.scann_searcher import build_scann
from realm_jax.models.realm import build_realm
from realm_jax.models.retriever import Retriever


def model_retriever() -> Retriever:
  """The retriever of the gin-configured REALM model."""
  realm = build_realm()
  return Retriever(realm.retriever_config, realm.projection_size,
                   realm.share_towers, realm.retriever_pooling)


def embed_and_publish(index, step: int, embedder: DocumentEmbedder, params,
                      local_arrays, corpus_metadata: dict,
                      searcher: str = 'exact') -> None:
  """Embeds every block with `params` (the retriever's) and publishes `step`."""
  start = time.perf_counter()
  embeddings, docs_per_s = embed_corpus(embedder, params, local_arrays,
                                        corpus_metadata['num_blocks'])
  scann = build_scann(embeddings) if searcher == 'scann' else None
  publication.publish(index, step, embeddings, publication.index_metadata(
      corpus_metadata, embeddings, step, searcher,
      local_arrays['token_ids'].shape[1]), scann)
  print(f'published index step {step}: {len(embeddings):,} blocks in '
        f'{time.perf_counter() - start:.1f}s (embedding {docs_per_s:,.0f} '
        f'docs/s on {jax.device_count()} {jax.devices()[0].platform} '
        'device(s))', flush=True)


def _wait_for_checkpoints(model_dir: str, poll_seconds: float):
  while not epath.Path(publication.checkpoints_dir(model_dir)).is_dir():
    time.sleep(poll_seconds)
  return publication.trainer_checkpoints(model_dir)


@gin.configurable
def run_refresh(model_dir: str, corpus_dir: str, searcher: str = 'exact',
                poll_seconds: float = 2.0, batch_size: int = 64,
                max_to_keep: int = 3, block_length: int | None = None) -> int:
  """Refreshes until training is done; returns the number of publishes.

  `block_length` cuts every block as the trainer's `Pretrain.block_length`
  does (the trainer refuses an index embedded with another cut).
  """
  if searcher not in publication.SEARCHERS:
    raise ValueError(f'searcher={searcher!r}; expected one of '
                     f'{publication.SEARCHERS}.')
  distributed.initialize()
  corpus_metadata = corpus.load_metadata(corpus_dir)
  arrays = local_block_arrays(corpus_dir, block_length)
  embedder = DocumentEmbedder(model_retriever(), batch_size)
  index = publication.index_manager(publication.index_dir(model_dir),
                                     max_to_keep=max_to_keep)
  checkpoints = _wait_for_checkpoints(model_dir, poll_seconds)
  last = index.latest_step()
  published = 0
  print(f'index builder: {corpus_metadata["num_blocks"]:,} blocks, polling '
        f'{publication.checkpoints_dir(model_dir)} (last index step {last})',
        flush=True)
  while True:
    saved = steps.reload(checkpoints)
    step = saved[-1] if saved else None
    indexes = steps.reload(index)  # A trainer may have published its first.
    if indexes:
      last = max(last if last is not None else -1, indexes[-1])
    # Embedding and publishing are collective: process 0's view decides.
    due = distributed.agree(
        step if step is not None and (last is None or step > last) else -1)
    if due >= 0:
      step = due
      params = publication.restore_retriever_params(checkpoints, step)
      if not distributed.everyone(params is not None):
        time.sleep(poll_seconds)
        continue
      embed_and_publish(index, step, embedder, params, arrays,
                        corpus_metadata, searcher)
      last, published = step, published + 1
      continue
    if distributed.agree(publication.training_done(model_dir)):
      print(f'training done; index builder exits after {published} '
            'refreshes', flush=True)
      return published
    time.sleep(poll_seconds)
