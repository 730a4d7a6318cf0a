"""An annotated corpus's sentences and salient spans as bounds into its
block store: what pre-training queries are drawn from without TensorFlow.

The seqio tasks mask a span of an annotated block (`salient_spans`) as they
read it, with TensorFlow. Written once where TensorFlow is (`realm-jax data
export` of a pre-training run), a split of the annotation becomes small
arrays under `<arrays root>/salient_spans_<corpus>/<split>/`, of which no
wordpiece is a copy:

- the split's blocks (`block_ids`) and the sentences of each
  (`block_sentences`: offsets into the sentence arrays);
- each sentence as bounds into its block's wordpieces in the block store
  (`sentence_starts`, `sentence_lengths`): the corpus tokenized each
  sentence by itself, as the seqio task does the sentence it masks at
  random, so the block holds its wordpieces;
- each salient span as its block (`span_blocks`, an index into
  `block_ids`), a row (`span_rows`: a sentence) and its wordpiece bounds in
  that row (`span_starts`, `span_ends`).

The seqio task tokenizes the text before a span, the span and the text
after it apart (`masking.mask_salient_span`). Where the three give other
wordpieces than the sentence (a span that ends inside a word, as "1023" of
"6.02214076×1023" does: 12 of the demo corpus's 59,061 training spans), the
three, joined, are a row of their own (`cut_tokens`, cut by `cut_offsets`;
rows past the sentences); so a span's row, cut at its bounds, is always what
the seqio task masks. The queries themselves are drawn when a batch is made
(`masked_queries`).

The metadata (`metadata.json`) follows `example_arrays`: the corpus's
fingerprint (which names its block store) and the vocabulary's (a reader
refuses spans of another of either, naming both), the annotated split's
(its TFRecord's sha256: the same annotation is not written twice), the
counts, and a fingerprint of the arrays, which a training run's data
position records. Values are stored as uint8 or uint16 where every one
fits.
"""

import itertools
import json
import os
from typing import Iterable

import numpy as np
from etils import epath

from realm_jax import checksums, errors
from realm_jax.data import block_store, corpus, example_arrays

NAME = 'salient_spans'
ARRAYS = ('block_ids', 'block_sentences', 'sentence_starts',
          'sentence_lengths', 'cut_tokens', 'cut_offsets', 'span_blocks',
          'span_rows', 'span_starts', 'span_ends')
_BLOCKS_PER_CALL = 256  # Blocks whose texts one tokenizer call takes.


def directory(corpus_name: str, split: str, root: str | None = None
              ) -> epath.Path:
  """Where a corpus's spans of `split` are, beside the exported examples."""
  return example_arrays.directory(f'{NAME}_{corpus_name}', split, root)


def _texts(block) -> list[bytes]:
  """A block's sentences, then the text before, in and after each span."""
  body, starts, ends = (block['body'], block['sentence_starts'],
                        block['sentence_ends'])
  texts = [body[s:e] for s, e in zip(starts, ends)]
  for start, end, sentence in zip(block['span_starts'], block['span_ends'],
                                  block['span_sentences']):
    texts += [body[starts[sentence]:start], body[start:end],
              body[end:ends[sentence]]]
  return texts


def _arrays(blocks: Iterable[dict], tokenizer, store: block_store.BlockStore,
            path) -> dict[str, np.ndarray]:
  """The arrays of annotated blocks (`salient_spans.ANNOTATED_FEATURES`,
  as numpy), tokenized as the seqio task tokenizes them."""
  block_ids, block_sentences, starts, lengths = [], [0], [], []
  spans, cuts = [], []
  blocks = iter(blocks)
  while batch := list(itertools.islice(blocks, _BLOCKS_PER_CALL)):
    pieces = iter(tokenizer.tokenize(
        [text for block in batch for text in _texts(block)]).to_list())
    for block in batch:
      block_id = int(block['block_id'])
      wordpieces = store.token_ids(block_id).tolist()
      at = store.title_length(block_id) + 2  # [CLS] t [SEP]
      sentences = [next(pieces) for _ in block['sentence_starts']]
      for index, sentence in enumerate(sentences):
        if wordpieces[at:at + len(sentence)] != sentence:
          raise errors.BadInput(
              f'{path}: sentence {index} of block {block_id} has other '
              'wordpieces in the block store than the task\'s vocabulary '
              'gives it: was the corpus built with another vocabulary?')
        starts.append(at)
        lengths.append(len(sentence))
        at += len(sentence)
      for sentence in block['span_sentences'].tolist():
        before, span, after = next(pieces), next(pieces), next(pieces)
        row = block_sentences[-1] + sentence
        if before + span + after != sentences[sentence]:
          cuts.append(before + span + after)
          row = -len(cuts)  # The cut rows follow the sentences, below.
        spans.append((len(block_ids), row, len(before),
                      len(before) + len(span)))
      block_ids.append(block_id)
      block_sentences.append(len(starts))
  spans = np.asarray(spans, np.int64).reshape(-1, 4)
  spans[:, 1] = np.where(spans[:, 1] < 0, len(starts) - spans[:, 1] - 1,
                         spans[:, 1])
  compact = lambda values: example_arrays.compact(np.asarray(values,
                                                             np.int64))
  return {
      'block_ids': compact(block_ids),
      'block_sentences': compact(block_sentences),
      'sentence_starts': compact(starts), 'sentence_lengths': compact(lengths),
      'cut_tokens': compact([i for cut in cuts for i in cut]),
      'cut_offsets': compact(np.cumsum([0] + [len(cut) for cut in cuts])),
      **{name: compact(spans[:, column])
         for column, name in enumerate(('span_blocks', 'span_rows',
                                        'span_starts', 'span_ends'))}}


def write(corpus_name: str, split: str, tokenizer,
          root: str | None = None) -> dict:
  """Writes the spans of the corpus's annotated `split` (unless spans made
  from the same annotation, corpus and vocabulary are there) and returns
  their metadata. Reads the annotation and tokenizes with TensorFlow."""
  tf = corpus.tensorflow()
  from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
  corpus_dir = corpus.corpus_dir(corpus_name)
  path = (epath.Path(corpus_dir) / salient_spans.ANNOTATED_DIR /
          f'{split}.tfrecord')
  if not path.exists():
    raise errors.NotFound(
        f'No annotated corpus at {path}: run `realm-jax data build-corpus` '
        f'and `realm-jax data annotate --corpus_dir={corpus_dir}`.')
  sources = {
      'corpus_name': corpus_name,
      'corpus_fingerprint': corpus.load_metadata(corpus_dir)[
          'corpus_fingerprint'],
      'vocab_fingerprint': corpus.vocab_hash(tokenizer.vocab_path),
      'annotation_fingerprint': checksums.sha256(path)}
  output = directory(corpus_name, split, root)
  if (output / example_arrays.METADATA).is_file():
    written = json.loads((output / example_arrays.METADATA).read_text())
    if all(written.get(k) == v for k, v in sources.items()):
      return written
  blocks = tf.data.TFRecordDataset(os.fspath(path)).map(
      salient_spans.parse_annotated_block).as_numpy_iterator()
  arrays = _arrays(blocks, tokenizer, block_store.open_store(corpus_dir),
                   path)
  if not len(arrays['span_rows']):
    raise errors.BadInput(f'{path} holds no salient span.')
  metadata = {
      **sources, 'split': split, 'blocks': len(arrays['block_ids']),
      'sentences': len(arrays['sentence_starts']),
      'cut_rows': len(arrays['cut_offsets']) - 1,
      'spans': len(arrays['span_rows']),
      'fingerprint': example_arrays.fingerprint(arrays)}
  example_arrays.save(output, arrays, metadata)
  return metadata


class SpanArrays:
  """One split's sentences and spans, memory-mapped, and the block store
  whose wordpieces they bound."""

  def __init__(self, path, store: block_store.BlockStore):
    self.path, self.store = epath.Path(path), store
    self.metadata = example_arrays.read_metadata(
        self.path, 'salient spans',
        'Write them where TensorFlow is, with `realm-jax data export` of a '
        'pre-training run (or bring a bundle).')
    self.arrays = example_arrays.load_arrays(self.path, ARRAYS)
    counts = {name: self.metadata[count] for name, count in (
        ('block_ids', 'blocks'), ('sentence_starts', 'sentences'),
        ('sentence_lengths', 'sentences'), ('span_blocks', 'spans'),
        ('span_rows', 'spans'), ('span_starts', 'spans'),
        ('span_ends', 'spans'))}
    counts['block_sentences'] = self.metadata['blocks'] + 1  # Offsets.
    counts['cut_offsets'] = self.metadata['cut_rows'] + 1
    for name, expected in counts.items():
      if len(self.arrays[name]) != expected:
        raise errors.BadInput(f'{self.path / f"{name}.npy"}: '
                              f'{len(self.arrays[name])} rows, but '
                              f'{self.path / example_arrays.METADATA} says '
                              f'{expected}.')
    self.num_blocks = self.metadata['blocks']
    self.num_spans = self.metadata['spans']

  def check(self, **expected) -> None:
    """Refuses spans made from another vocabulary or corpus (`expected`:
    metadata field -> value), naming both sides."""
    example_arrays.check_sources(self.path, self.metadata, expected)

  def block_id(self, block: int) -> int:
    return int(self.arrays['block_ids'][block])

  def sentences(self, block: int) -> range:
    """The rows of block `block`'s sentences (an index into `block_ids`)."""
    return range(*(int(i) for i in
                   self.arrays['block_sentences'][block:block + 2]))

  def row(self, block: int, row: int) -> np.ndarray:
    """Row `row` (of block `block`), int32 wordpieces: a sentence, from the
    block store, or a span's own row."""
    sentences = self.metadata['sentences']
    if row >= sentences:
      start, stop = self.arrays['cut_offsets'][row - sentences:
                                               row - sentences + 2]
      return self.arrays['cut_tokens'][start:stop].astype(np.int32)
    block_id = self.block_id(block)
    start = (int(self.store.read('token_offsets', block_id, block_id + 1)[0])
             + int(self.arrays['sentence_starts'][row]))
    stop = start + int(self.arrays['sentence_lengths'][row])
    return self.store.read('token_ids', start, stop).astype(np.int32)

  def span(self, index: int) -> tuple[int, int, int, int]:
    """(block, row, start, end) of span `index`."""
    return tuple(int(self.arrays[name][index]) for name in
                 ('span_blocks', 'span_rows', 'span_starts', 'span_ends'))
