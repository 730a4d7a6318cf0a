"""Embedding every block of a corpus with the document tower.

The block batch is sharded over all devices of a 1-D data mesh and the tower
runs under one jit. With several JAX processes each one embeds its own
contiguous range of blocks. Blocks are sorted by length and padded to a
multiple of 32 wordpieces, so little compute goes to padding and only a few
shapes compile.
"""

import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.models import target
from realm_jax.models.retriever import Retriever
from realm_jax.progress import Progress

_LENGTH_BUCKET = 32


def _per_process(num_blocks: int) -> int:
  return -(-num_blocks // jax.process_count())


def _local_range(num_blocks: int) -> tuple[int, int]:
  """This process's contiguous share of the blocks (all of them on one host)."""
  start = min(num_blocks, jax.process_index() * _per_process(num_blocks))
  return start, min(num_blocks, start + _per_process(num_blocks))


def local_block_arrays(corpus: OpenCorpus, max_length: int | None = None
                       ) -> dict[str, np.ndarray]:
  """This process's share of the blocks, read from the corpus."""
  return corpus.padded(max_length, *_local_range(corpus.num_blocks))


def local_share(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's share of arrays that hold every block."""
  start, stop = _local_range(len(arrays['token_ids']))
  return {name: value[start:stop] for name, value in arrays.items()}


def gather_embeddings(local: np.ndarray, num_blocks: int) -> np.ndarray:
  """Every process's share, in block order, on every process."""
  if jax.process_count() == 1:
    return local
  padded = np.zeros((_per_process(num_blocks), local.shape[1]), local.dtype)
  padded[:len(local)] = local
  return np.asarray(multihost_utils.process_allgather(padded, tiled=True)
                    )[:num_blocks]


class DocumentEmbedder:
  """Embed_doc(z) for many blocks, batch-sharded over the local devices."""

  def __init__(self, retriever: Retriever, batch_size: int = 64, devices=None):
    devices = list(devices if devices is not None else jax.local_devices())
    if batch_size % len(devices):
      raise ValueError(f'batch_size={batch_size} must divide over '
                       f'{len(devices)} devices.')
    self.batch_size = batch_size
    self.mesh = jax.make_mesh((len(devices),), ('data',),
                              (jax.sharding.AxisType.Auto,), devices=devices)
    self._sharding = NamedSharding(self.mesh, P('data'))
    replicated = NamedSharding(self.mesh, P())
    platform = target.platform_of(devices)

    def embed(params, batch):
      return retriever.apply(
          {'params': params}, batch['token_ids'], batch['input_mask'],
          batch['token_type_ids'], method='embed_documents')

    self._embed = target.forward_only_jit(
        embed, platform, self.mesh,
        in_shardings=(replicated, self._sharding),
        out_shardings=self._sharding)
    self._replicated = replicated

  def trace(self, abstract_params, block_length: int):
    """The step traced for a full batch of `block_length` wordpieces, with
    `jax.ShapeDtypeStruct` parameters: nothing is allocated. Its `jaxpr`
    is the step's; `lower()` lowers it."""
    batch = {k: jax.ShapeDtypeStruct((self.batch_size, block_length),
                                     np.int32)
             for k in ('token_ids', 'input_mask', 'token_type_ids')}
    return self._embed.trace(abstract_params, batch)

  def lower(self, abstract_params, block_length: int):
    """`trace(...)` lowered."""
    return self.trace(abstract_params, block_length).lower()

  def __call__(self, params, arrays: dict[str, np.ndarray],
               progress: Progress | None = None) -> np.ndarray:
    """[n, D] float32 embeddings of the blocks in `arrays`."""
    # A multi-host trainer's parameters span every process's devices; each
    # process embeds with its own full copy on its local devices.
    params = jax.tree.map(
        lambda x: multihost_utils.process_allgather(x, tiled=True)
        if isinstance(x, jax.Array) and not x.is_fully_addressable else x,
        params)
    params = jax.device_put(params, self._replicated)
    return embed_in_length_buckets(
        lambda batch: self._embed(params, jax.device_put(batch,
                                                         self._sharding)),
        arrays, self.batch_size, progress)


def embed_in_length_buckets(embed_batch, arrays: dict[str, np.ndarray],
                            batch_size: int,
                            progress: Progress | None = None) -> np.ndarray:
  """Runs `embed_batch` over length-sorted batches; rows in input order.

  Each batch is cut to its longest row rounded up to 32 wordpieces, and the
  last one is filled with copies, so only a few shapes ever compile.
  """
  lengths = arrays['input_mask'].sum(axis=1)
  order = np.argsort(lengths, kind='stable')
  out = None
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    width = min(arrays['token_ids'].shape[1],
                -(-int(lengths[rows].max()) // _LENGTH_BUCKET) * _LENGTH_BUCKET)
    take = np.concatenate([rows, np.repeat(rows[-1:], batch_size - len(rows))])
    embedded = np.asarray(embed_batch(
        {k: v[take, :width] for k, v in arrays.items()}))[:len(rows)]
    if out is None:
      out = np.zeros((len(order), embedded.shape[1]), np.float32)
    out[rows] = embedded
    if progress is not None:
      progress.update(len(rows))
  return out


def embed_corpus(embedder: DocumentEmbedder, params, local_arrays,
                 num_blocks: int) -> tuple[np.ndarray, float]:
  """(all [num_blocks, D] embeddings, this process's docs/s), with progress.

  `local_arrays` is this process's share (see `local_block_arrays`).
  """
  progress = Progress('embedded', len(local_arrays['token_ids']), unit='docs')
  start = time.perf_counter()
  local = embedder(params, local_arrays, progress)
  docs_per_s = len(local) / max(time.perf_counter() - start, 1e-9)
  return gather_embeddings(local, num_blocks), docs_per_s
