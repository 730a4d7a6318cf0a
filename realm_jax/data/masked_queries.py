"""Masked-LM queries drawn from span arrays when their batch is made: REALM
pre-training without TensorFlow.

The rules are the seqio tasks' (`masking`, which imports its constants from
here), in numpy over the wordpieces of `span_arrays`:

- salient (the paper's): `[CLS] sentence [SEP]` of a salient span, up to the
  query length, every wordpiece of the span [MASK]; words before the span
  are dropped where the query is too short for both, so the span stays;
- random_uniform: BERT's 15% of a random sentence of the block, 80% [MASK],
  10% a random wordpiece, 10% kept;
- random_span: SpanBERT-like spans of a random sentence, lengths from
  Geometric(0.2) clipped to 10, added while 15% of the wordpieces cover
  them, all [MASK].

What is drawn is a pure function of the seed and the position in the stream
(`example_arrays.stream`: epoch e permuted by `default_rng([seed, e])`,
global batch b at positions [b B, (b + 1) B), each process its own rows), so
a resumed run draws the same queries, whatever the process count.

- salient: an epoch is every (block, span) pair of the split once, so no
  query comes back before every span was drawn once (the seqio task draws
  one span per block an epoch); unshuffled, the pairs in order: the held-out
  task (`task_names.held_out`), which scores every span of every held-out
  block once.
- The ablations: an epoch is every block once, as in the seqio task, whose
  distribution they keep: a block's sentences are equally likely, not the
  corpus's (a sentence epoch would favour blocks of many sentences). The
  sentence and the masks come from the example's own generator, numpy's
  child stream `position` of the seed (`generator`).
"""

from typing import Iterator

import numpy as np

from realm_jax import errors
from realm_jax.data import example_arrays, task_names
from realm_jax.data.span_arrays import SpanArrays
from realm_jax.data.tokenization import WordPieceTokenizer

MASK_RATE = 0.15
SPAN_GEOMETRIC_P = 0.2
MAX_RANDOM_SPAN = 10
RANDOM_SPAN_DRAWS = 16
FEATURES = ('query_token_ids', 'mlm_positions', 'mlm_targets', 'block_id')


def generator(seed: int, position: int) -> np.random.Generator:
  """The generator of the query at `position` of the stream: a spawned
  child of the seed, never the stream of an epoch's permutation."""
  return np.random.default_rng(np.random.SeedSequence(
      seed, spawn_key=(int(position),)))


def _mask_count(length: int) -> int:
  # As tf.round(MASK_RATE * float32 length): half to even, in float32.
  return max(1, int(np.round(np.float32(MASK_RATE) * np.float32(length))))


def salient_query(tokens: np.ndarray, start: int, end: int, keep: int,
                  mask_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(wordpieces between [CLS] and [SEP], masked positions among them,
  targets) of the span tokens[start:end], in at most `keep` wordpieces."""
  span = min(end - start, keep)
  drop = max(start + span - keep, 0)
  query = np.concatenate([tokens[drop:start], np.full(span, mask_id,
                                                      np.int32),
                          tokens[end:]])[:keep]
  return query, start - drop + np.arange(span), tokens[start:start + span]


def random_uniform_query(tokens: np.ndarray, rng: np.random.Generator,
                         mask_id: int, random_ids: tuple[int, int]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """BERT's masking of `tokens`; `random_ids`: [low, high) of the random
  replacements."""
  count = min(_mask_count(len(tokens)), len(tokens))
  positions = np.sort(rng.choice(len(tokens), count, replace=False))
  targets = tokens[positions]
  draw = rng.random(count)
  replacement = np.where(draw < 0.8, mask_id, np.where(
      draw < 0.9, rng.integers(*random_ids, count), targets))
  query = tokens.copy()
  query[positions] = replacement
  return query, positions, targets


def random_span_query(tokens: np.ndarray, rng: np.random.Generator,
                      mask_id: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """SpanBERT-like masking of `tokens` (as `masking.random_span_mask`)."""
  length = len(tokens)
  budget = _mask_count(length)
  uniform = rng.uniform(1e-6, 1.0, RANDOM_SPAN_DRAWS)
  lengths = np.clip(1 + (np.log(uniform) / np.log(1 - SPAN_GEOMETRIC_P)
                         ).astype(np.int32), 1, MAX_RANDOM_SPAN)
  starts = rng.integers(0, length, RANDOM_SPAN_DRAWS)
  covered = np.zeros(length, bool)
  for start, span in zip(starts, lengths):  # Added while they fit.
    grown = covered.copy()
    grown[start:start + span] = True
    if grown.sum() <= budget:
      covered = grown
  if not covered.any():  # Spans longer than a short sentence's budget.
    covered[starts[0]] = True
  positions = np.flatnonzero(covered)
  return np.where(covered, mask_id, tokens), positions, tokens[positions]


# The maskings that draw one query a salient span (the others, one a block).
SALIENT = ('salient', task_names.EVERY_SPAN)


def queries_an_epoch(span_metadata: dict, masking: str) -> int:
  """An epoch's queries over spans of that metadata."""
  return span_metadata['spans' if masking in SALIENT else 'blocks']


class Draws:
  """The queries of one masking (`task_names.MASKINGS`, or EVERY_SPAN) over
  one split's spans: `count` of them an epoch, `rows` drawn at stream
  positions."""

  def __init__(self, spans: SpanArrays, masking: str,
               tokenizer: WordPieceTokenizer):
    if masking not in (*task_names.MASKINGS, task_names.EVERY_SPAN):
      raise errors.BadConfig(f'masking={masking!r}; expected one of '
                             f'{task_names.MASKINGS}.')
    self.spans, self.masking = spans, masking
    self.salient = masking in SALIENT
    self.count = queries_an_epoch(spans.metadata, masking)
    self.cls_id, self.sep_id = tokenizer.cls_id, tokenizer.sep_id
    self.mask_id = tokenizer.mask_id
    self.random_ids = (tokenizer.first_regular_id, tokenizer.vocab_size)

  def query(self, index: int, position: int, seed: int, keep: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Example `index` drawn at stream `position`: (wordpieces between [CLS]
    and [SEP], masked positions among them, targets, block id)."""
    if self.salient:
      block, row, start, end = self.spans.span(index)
      return (*salient_query(self.spans.row(block, row), start, end, keep,
                             self.mask_id), self.spans.block_id(block))
    rng = generator(seed, position)
    sentences = self.spans.sentences(index)
    tokens = self.spans.row(index, sentences[rng.integers(len(sentences))]
                            )[:keep]
    if not len(tokens):  # A sentence without wordpieces: nothing masked.
      drawn = tokens, np.zeros(0, np.int64), tokens
    elif self.masking == 'random_uniform':
      drawn = random_uniform_query(tokens, rng, self.mask_id, self.random_ids)
    else:
      drawn = random_span_query(tokens, rng, self.mask_id)
    return (*drawn, self.spans.block_id(index))

  def rows(self, indices: np.ndarray, positions: np.ndarray, seed: int,
           shapes: dict) -> dict[str, np.ndarray]:
    """The queries of examples `indices` at stream `positions`, as the seqio
    task's features cut and zero-padded to `shapes`."""
    missing = sorted(set(shapes) - set(FEATURES))
    if missing:
      raise KeyError(f'Drawn masked-LM queries have no features {missing}; '
                     f'they have {list(FEATURES)}.')
    out = {name: np.zeros((len(indices), *shape), np.int32)
           for name, shape in shapes.items()}
    keep = shapes['query_token_ids'][0] - 2
    for row, (index, position) in enumerate(zip(indices, positions)):
      tokens, masked, targets, block_id = self.query(int(index), position,
                                                     seed, keep)
      drawn = {'query_token_ids': np.concatenate(
                   [[self.cls_id], tokens, [self.sep_id]]),
               'mlm_positions': masked + 1, 'mlm_targets': targets}
      for name, values in drawn.items():
        if name in out:
          values = values[:out[name].shape[1]]
          out[name][row, :len(values)] = values
      if 'block_id' in out:
        out['block_id'][row] = block_id
    return out


def batches(draws: Draws, shapes: dict, batch_size: int, seed: int = 0,
            shuffle: bool = True, num_epochs: int | None = None,
            skip_batches: int = 0, process_index: int = 0,
            process_count: int = 1, drop_remainder: bool = True
            ) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of each global batch, drawn, from batch
  `skip_batches` on."""
  for positions, indices in example_arrays.stream(
      draws.count, batch_size, seed, shuffle, num_epochs, skip_batches,
      process_index, process_count, drop_remainder):
    yield draws.rows(indices, positions, seed, shapes)


def spans_held(block_tokens, targets, target_mask) -> np.ndarray:
  """[B, k] whether each block's wordpieces hold the query's masked span
  verbatim: the blocks a reader could copy it from.

  Args: block_tokens [B, k, L]; targets, target_mask [B, M].
  """
  held = np.zeros(block_tokens.shape[:2], bool)
  for row, (blocks, target, mask) in enumerate(
      zip(block_tokens, targets, np.asarray(target_mask, bool))):
    span = target[mask]
    if not len(span) or blocks.shape[-1] < len(span):
      continue
    windows = np.lib.stride_tricks.sliding_window_view(blocks, len(span),
                                                       axis=-1)
    held[row] = np.all(windows == span, axis=-1).any(axis=-1)
  return held


def draw_holders(articles: np.ndarray, tokens_of, block_ids, targets,
                 target_mask, rng: np.random.Generator, none: int,
                 fallback=None) -> np.ndarray:
  """[B] a block of each query's article, its own block excepted, that
  holds the query's masked span verbatim, drawn uniformly among those that
  do; where none does, `fallback`'s block ([B]), or else the query's own
  (where the span sits unmasked): without a fallback, a reader warmed on
  these finds its span in every block it reads.
  `articles`: each block's article (`BlockStore.articles`); `tokens_of`:
  [B, k] block ids (`none` for no block) -> [B, k, L] wordpieces."""
  ids = np.asarray(block_ids)
  first = np.searchsorted(articles, articles[ids], side='left')
  last = np.searchsorted(articles, articles[ids], side='right')
  others = first[:, None] + np.arange(int((last - first).max()))
  others = np.where((others < last[:, None]) & (others != ids[:, None]),
                    others, none)
  held = spans_held(tokens_of(others), targets, target_mask)
  held &= others != none
  # Uniform among the holders: the largest of random keys where held.
  keys = np.where(held, rng.random(held.shape), -1.0)
  drawn = others[np.arange(len(ids)), keys.argmax(axis=1)]
  return np.where(held.any(axis=1), drawn,
                  ids if fallback is None else fallback)
