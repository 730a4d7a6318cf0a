"""The index builder (`realm-jax refresh`): a separate process beside training.

It polls the trainer's checkpoints through a read-only Orbax manager; when
the newest step is due (see `due_step`) it restores only the retriever's
parameters, re-embeds every block with the document tower, builds the searcher
and publishes the index under model_dir/index with the trainer step as its
step. The builder alone sets how fresh the trainer's index is: the trainer
swaps in each index at its next step (see `client`). It exits when the
trainer marks training done and the last step is published. A checkpoint the
trainer prunes while it is listed or read is skipped (see `steps`), never
fatal.
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


def due_step(saved: list[int], last: int | None, interval: int,
             training_done: bool = False) -> int | None:
  """The checkpoint to embed next: the newest one, once it is `interval`
  steps past the last index (any newer one when training is done, so the
  final parameters get their index); None if none is due."""
  if not saved or (last is not None and saved[-1] <= last):
    return None
  if last is None or training_done or saved[-1] >= last + interval:
    return saved[-1]
  return None


class IndexBuilder:
  """One poll at a time of the builder's loop (see `run_refresh`)."""

  def __init__(self, model_dir: str, corpus_dir: str, searcher: str = 'exact',
               batch_size: int = 64, max_to_keep: int = 3,
               block_length: int | None = None, interval: int = 1):
    self.model_dir, self.searcher, self.interval = model_dir, searcher, interval
    self.corpus_metadata = corpus.load_metadata(corpus_dir)
    self.arrays = local_block_arrays(corpus_dir, block_length)
    self.embedder = DocumentEmbedder(model_retriever(), batch_size)
    self.index = publication.index_manager(publication.index_dir(model_dir),
                                           max_to_keep=max_to_keep)
    self.checkpoints = publication.trainer_checkpoints(model_dir)
    self.last = self.index.latest_step()
    self.published = 0

  def poll(self) -> str:
    """'published' a due step, 'waiting' for one, or training is 'done'."""
    # Read before the listing: a step saved after it must still be embedded.
    done = publication.training_done(self.model_dir)
    saved = steps.reload(self.checkpoints)
    indexes = steps.reload(self.index)  # A trainer may have published first.
    if indexes:
      self.last = max(self.last if self.last is not None else -1, indexes[-1])
    # Embedding and publishing are collective: process 0's view decides.
    step = due_step(saved, self.last, self.interval, done)
    due = distributed.agree(-1 if step is None else step)
    if due >= 0:
      params = publication.restore_retriever_params(self.checkpoints, due)
      if not distributed.everyone(params is not None):
        return 'waiting'
      embed_and_publish(self.index, due, self.embedder, params, self.arrays,
                        self.corpus_metadata, self.searcher)
      self.last, self.published = due, self.published + 1
      return 'published'
    return 'done' if distributed.agree(done) else 'waiting'


@gin.configurable
def run_refresh(model_dir: str, corpus_dir: str, searcher: str = 'exact',
                poll_seconds: float = 2.0, batch_size: int = 64,
                max_to_keep: int = 3, block_length: int | None = None,
                refresh_interval_steps: int = 1, stale_factor: int = 1) -> int:
  """Refreshes until training is done; returns the number of publishes.

  `block_length` cuts every block as the trainer's `Pretrain.block_length`
  does (the trainer refuses an index embedded with another cut). The cadence:
  a checkpoint is embedded once it is `refresh_interval_steps` x
  `stale_factor` steps past the last index (the paper re-embeds about every
  500 steps; a stale_factor of 30 is its stale-MIPS ablation), and the
  newest one always when training is done.
  """
  if refresh_interval_steps < 1 or stale_factor < 1:
    raise ValueError(f'refresh_interval_steps={refresh_interval_steps} and '
                     f'stale_factor={stale_factor} must be at least 1.')
  if searcher not in publication.SEARCHERS:
    raise ValueError(f'searcher={searcher!r}; expected one of '
                     f'{publication.SEARCHERS}.')
  distributed.initialize()
  while not epath.Path(publication.checkpoints_dir(model_dir)).is_dir():
    time.sleep(poll_seconds)
  builder = IndexBuilder(model_dir, corpus_dir, searcher, batch_size,
                         max_to_keep, block_length,
                         refresh_interval_steps * stale_factor)
  print(f'index builder: {builder.corpus_metadata["num_blocks"]:,} blocks, '
        f'polling {publication.checkpoints_dir(model_dir)} (last index step '
        f'{builder.last}), embedding a checkpoint every {builder.interval} '
        'steps', flush=True)
  while True:
    polled = builder.poll()
    if polled == 'done':
      print(f'training done; index builder exits after {builder.published} '
            'refreshes', flush=True)
      return builder.published
    if polled == 'waiting':
      time.sleep(poll_seconds)
