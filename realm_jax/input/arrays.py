"""The TF-free source: a task's examples pre-tokenized into memory-mapped
arrays (`data.example_arrays`, written by the seqio source's `export`),
permuted by the seed epoch by epoch, so the global batch depends on the
seed alone. Pre-training queries are not exported masked: the export writes
the corpus's sentences and salient spans (`data.span_arrays`), and each
query is drawn when its batch is made, from the seed and its position in
the stream (`data.masked_queries`).
"""

import jax
from etils import epath

from realm_jax import default_files
from realm_jax.data import (corpus, example_arrays, masked_queries, span_arrays,
                            task_names)
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.input.source import Questions, Source


def directory(task: str, split: str, root: str | None = None) -> epath.Path:
  """Where a task's split is exported: for a pre-training task, its
  corpus's span arrays."""
  parsed = task_names.masked_lm(task)
  if parsed is not None:
    return span_arrays.directory(parsed[0], split, root)
  return example_arrays.directory(task, split, root)


def draws(task: str, split: str, root: str | None = None,
          open_corpus=lambda name: OpenCorpus(corpus.corpus_dir(name))
          ) -> masked_queries.Draws | None:
  """A pre-training task's queries, drawn from its corpus's span arrays
  where those are (checked against the vocabulary and the corpus, which
  `open_corpus(name)` opens); None for examples exported under the task's
  own name (every other task, and the controlled world's queries,
  `data.world`)."""
  parsed = task_names.masked_lm(task)
  if parsed is None:
    return None
  corpus_name, masking = parsed
  path = span_arrays.directory(corpus_name, split, root)
  if not (path / example_arrays.METADATA).is_file():
    return None
  opened = open_corpus(corpus_name)
  spans = span_arrays.SpanArrays(path, opened.store())
  spans.check(
      vocab_fingerprint=corpus.vocab_hash(default_files.task_vocab()),
      corpus_fingerprint=opened.fingerprint)
  return masked_queries.Draws(spans, masking,
                              WordPieceTokenizer(default_files.task_vocab()))


class ArraysSource(Source):
  """Examples exported as arrays under `root` (default $REALM_ARRAYS_DIR,
  else runs/arrays), holding <task>/<split>/."""

  kind = 'arrays'

  def __init__(self, root: str | None = None):
    self.root = root
    self._corpora, self._draws = {}, {}

  def corpus(self, name: str) -> OpenCorpus:
    """Corpus `name`, opened once for every split and task read."""
    if name not in self._corpora:
      self._corpora[name] = OpenCorpus(corpus.corpus_dir(name))
    return self._corpora[name]

  def draws(self, task: str, split: str) -> masked_queries.Draws | None:
    """`draws` of a split, made once: a run asks for its position, its
    count and its batches."""
    if (task, split) not in self._draws:
      self._draws[task, split] = draws(task, split, self.root, self.corpus)
    return self._draws[task, split]

  def open(self, task: str, split: str, shapes: dict
           ) -> example_arrays.ExampleArrays:
    """A split's arrays, checked against the run's shapes, the vocabulary
    and (for a corpus's task) the corpus as it is now."""
    arrays = example_arrays.ExampleArrays(
        example_arrays.directory(task, split, self.root))
    expected = {'vocab_fingerprint': corpus.vocab_hash(
        default_files.task_vocab())}
    if arrays.metadata.get('corpus_name'):
      expected['corpus_fingerprint'] = self.corpus(
          arrays.metadata['corpus_name']).fingerprint
    arrays.check(shapes, **expected)
    return arrays

  def batches(self, task, split, shapes, batch_size, seed=0, shuffle=True,
              num_epochs=None, skip_batches=0, data_shards=None,
              drop_remainder=True):
    del data_shards  # The order depends on the seed alone.
    drawn = self.draws(task, split)
    if drawn is not None:
      return masked_queries.batches(
          drawn, shapes, batch_size, seed, shuffle, num_epochs, skip_batches,
          jax.process_index(), jax.process_count(), drop_remainder)
    return example_arrays.batches(
        self.open(task, split, shapes), shapes, batch_size, seed, shuffle,
        num_epochs, skip_batches, jax.process_index(), jax.process_count(),
        drop_remainder)

  def example_count(self, task, split, shapes):
    """The count as the split was exported, read from its metadata alone:
    the corpus may have changed since (the world's edits), the count has
    not."""
    del shapes
    parsed = task_names.masked_lm(task)
    spans = parsed and span_arrays.directory(parsed[0], split, self.root)
    if spans and (spans / example_arrays.METADATA).is_file():
      return masked_queries.queries_an_epoch(example_arrays.read_metadata(
          spans, 'salient spans', 'Export them again.'), parsed[1])
    return example_arrays.read_metadata(
        example_arrays.directory(task, split, self.root),
        'pre-tokenized examples', 'Export them again.')['count']

  def position(self, task, data_shards):
    """The arrays' own fingerprint (arrays exported again may hold other
    examples; spans written again, other queries), whatever the number of
    processes."""
    del data_shards
    drawn = self.draws(task, 'train')
    if drawn is not None:
      return {'source': self.kind,
              'spans_fingerprint': drawn.spans.metadata['fingerprint']}
    metadata = example_arrays.ExampleArrays(example_arrays.directory(
        task, 'train', self.root)).metadata
    return {'source': self.kind, 'arrays_fingerprint': metadata['fingerprint']}

  def questions(self, task, query_length, limit=None):
    arrays = self.open(task, 'test', {'query_token_ids': (query_length,)})
    count = min(arrays.count, limit or arrays.count)
    return Questions(arrays.strings()[:count],
                     arrays.arrays['query_token_ids'][:count],
                     bool(arrays.metadata.get('regex')))
