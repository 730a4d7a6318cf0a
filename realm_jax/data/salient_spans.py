"""Salient span annotation: named entities and dates that need world knowledge.

REALM masks one salient span per example (Guu et al. 2020, §3.4): entities
found by a named-entity tagger and dates found by a regular expression. Like
the released code this is an offline pass over the corpus: it writes an
annotated copy of the blocks (train and validation shards) holding each usable
span's byte offsets and sentence, for the masking in the input pipeline.

A span is usable when it lies inside one sentence and its last wordpiece still
fits in a query of `max_query_length` wordpieces cut from that sentence; other
spans are counted and dropped here, so masking never truncates a mask.
"""

import collections
import json
import logging
import os
import re
from typing import Iterator

import tensorflow as tf
from etils import epath

from realm_jax import default_files
from realm_jax.data import corpus
from realm_jax.data.skips import SkipReport
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.progress import Progress

log = logging.getLogger(__name__)

SALIENT_LABELS = frozenset({
    'PERSON', 'NORP', 'FAC', 'ORG', 'GPE', 'LOC', 'PRODUCT', 'EVENT',
    'WORK_OF_ART', 'LAW', 'LANGUAGE', 'DATE'})
MAX_QUERY_LENGTH = 96
ANNOTATED_DIR = 'annotated'
_MONTHS = ('January|February|March|April|May|June|July|August|September|'
           'October|November|December')
# "20 July 1969", "July 20, 1969", "July 1969", "1969" (years 1000-2099).
DATE_PATTERN = re.compile(
    rf'\b(?:(?:\d{{1,2}} )?(?:{_MONTHS})(?: \d{{1,2}},?)? )?(?:1\d{{3}}|20\d{{2}})\b')


def date_spans(text: str) -> list[tuple[int, int]]:
  """Character spans of dates found by DATE_PATTERN."""
  return [m.span() for m in DATE_PATTERN.finditer(text)]


def merge_spans(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
  """Sorted, non-overlapping spans; of two overlapping, the longer wins."""
  chosen = []
  for start, end, label in sorted(spans, key=lambda s: (-(s[1] - s[0]), s[0])):
    if all(end <= s or start >= e for s, e, _ in chosen):
      chosen.append((start, end, label))
  return sorted(chosen)


def _byte_offsets(text: str) -> list[int]:
  """Byte offset of every character position (and of the end)."""
  offsets, total = [], 0
  for char in text:
    offsets.append(total)
    total += len(char.encode('utf-8'))
  offsets.append(total)
  return offsets


def load_tagger(model_dir: str | None = None):
  import spacy  # pylint: disable=g-import-not-at-top
  # Sentences come from the corpus; only the tagger's NER is needed.
  return spacy.load(model_dir or default_files.ner_model_dir(),
                    exclude=['tagger', 'parser', 'attribute_ruler',
                             'lemmatizer', 'senter'])


class SpanAnnotator:
  """Finds usable salient spans of blocks; counts what it drops."""

  def __init__(self, tokenizer: WordPieceTokenizer, tagger,
               max_query_length: int = MAX_QUERY_LENGTH,
               num_processes: int = 1, batch_size: int = 1024):
    self.tokenizer = tokenizer
    self.batch_size = batch_size
    self.tagger = tagger
    self.max_query_length = max_query_length
    self.num_processes = num_processes
    self.report = SkipReport('annotate')
    self.labels: collections.Counter = collections.Counter()

  def candidates(self, block: dict, doc) -> list[tuple[int, int, int, str]]:
    """(byte start, byte end, sentence, label) of the spans inside a sentence."""
    text = block['body']
    found = [(e.start_char, e.end_char, e.label_) for e in doc.ents
             if e.label_ in SALIENT_LABELS]
    found += [(s, e, 'DATE') for s, e in date_spans(text)]
    offsets = _byte_offsets(text)
    out = []
    for start, end, label in merge_spans(found):
      start, end = offsets[start], offsets[end]
      sentence = next((i for i, (s, e) in enumerate(zip(
          block['sentence_starts'], block['sentence_ends']))
                       if s <= start and end <= e), None)
      if sentence is None:
        self.report.add('span across sentences', block['title'])
      else:
        out.append((start, end, sentence, label))
    return out

  def usable(self, blocks: list[dict], candidates) -> list[list[tuple]]:
    """Per block: the (byte start, byte end, sentence) that fit in a query.

    A span fits when [CLS], its sentence up to the span's end, and [SEP] do;
    the text before the span and the span are counted apart, exactly as the
    masking in the input pipeline tokenizes them.
    """
    flat = [(b, span) for b, spans in enumerate(candidates) for span in spans]
    pieces = []
    for b, (start, end, sentence, _) in flat:
      body = blocks[b]['body'].encode('utf-8')
      pieces += [body[blocks[b]['sentence_starts'][sentence]:start],
                 body[start:end]]
    counts = [len(ids) for ids in self.tokenizer.tokenize(
        tf.constant(pieces, tf.string)).to_list()] if pieces else []
    out = [[] for _ in blocks]
    for (b, (start, end, sentence, label)), before, inside in zip(
        flat, counts[::2], counts[1::2]):
      if not inside:
        self.report.add('span without wordpieces', blocks[b]['title'])
        continue
      if before + inside + 2 > self.max_query_length:
        self.report.add(f'span past the {self.max_query_length}-wordpiece '
                        'query', blocks[b]['title'])
        continue
      out[b].append((start, end, sentence))
      self.labels[label] += 1
    for b, spans in enumerate(out):
      if not spans:
        self.report.add('block without a salient span', blocks[b]['title'])
    return out

  def annotate(self, blocks) -> Iterator[tuple[dict, list[tuple]]]:
    """(block, usable spans) for a stream of blocks, in order.

    One tagger pipe serves the whole stream, so its worker processes start
    once; wordpiece counts are batched every `batch_size` blocks.
    """
    docs = self.tagger.pipe(((b['body'], b) for b in blocks), as_tuples=True,
                            batch_size=64, n_process=self.num_processes)
    batch, found = [], []
    for doc, block in docs:
      batch.append(block)
      found.append(self.candidates(block, doc))
      if len(batch) == self.batch_size:
        yield from zip(batch, self.usable(batch, found))
        batch, found = [], []
    if batch:
      yield from zip(batch, self.usable(batch, found))


class SiblingSpans:
  """How many held-out salient spans occur, as words, in another block of
  their own article (a sibling: the blocks of one article are consecutive
  and carry its title, which counts as their text too). Such a span can be
  read from a block that the trivial-retrieval exclusion leaves in, so it
  bounds what copying from the own article can give. Matching is by text,
  ignoring case; an article is held one at a time.
  """

  def __init__(self):
    self.counts: collections.Counter = collections.Counter()
    self._article: list[tuple[str, str, list[str]]] = []

  def add(self, block: dict, spans, held_out: bool) -> None:
    if self._article and self._article[0][0] != block['title']:
      self._flush()
    body = block['body'].encode('utf-8')
    texts = ([body[start:end].decode('utf-8') for start, end, _ in spans]
             if held_out else [])
    self._article.append((block['title'], block['body'], texts))

  def _flush(self) -> None:
    for i, (_, _, texts) in enumerate(self._article):
      others = [f'{title}\n{body}'.lower() for j, (title, body, _)
                in enumerate(self._article) if j != i]
      for text in texts:
        self.counts['spans'] += 1
        if not others:
          continue
        self.counts['in_articles_of_several_blocks'] += 1
        word = re.compile(r'(?<!\w)' + re.escape(text.lower()) + r'(?!\w)')
        if any(word.search(other) for other in others):
          self.counts['in_a_sibling_block'] += 1
    self._article = []

  def as_dict(self) -> dict:
    self._flush()
    spans = self.counts['spans']
    return {'spans': spans,
            'in_articles_of_several_blocks':
                self.counts['in_articles_of_several_blocks'],
            'in_a_sibling_block': self.counts['in_a_sibling_block'],
            'share_in_a_sibling_block':
                self.counts['in_a_sibling_block'] / max(spans, 1)}


def _annotated_example(block: dict, spans) -> bytes:
  ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
  text = lambda s: tf.train.Feature(
      bytes_list=tf.train.BytesList(value=[s.encode('utf-8')]))
  return tf.train.Example(features=tf.train.Features(feature={
      'block_id': ints([block['block_id']]),
      'title': text(block['title']),
      'body': text(block['body']),
      'token_ids': ints(block['token_ids']),
      'title_length': ints([block['title_length']]),
      'sentence_starts': ints(block['sentence_starts']),
      'sentence_ends': ints(block['sentence_ends']),
      'span_starts': ints([s for s, _, _ in spans]),
      'span_ends': ints([e for _, e, _ in spans]),
      'span_sentences': ints([i for _, _, i in spans]),
  })).SerializeToString()


ANNOTATED_FEATURES = {
    **corpus.block_features(),
    'span_starts': tf.io.RaggedFeature(tf.int64),
    'span_ends': tf.io.RaggedFeature(tf.int64),
    'span_sentences': tf.io.RaggedFeature(tf.int64),
}


def parse_annotated_block(serialized):
  return tf.io.parse_single_example(serialized, ANNOTATED_FEATURES)


def is_validation(block_id, validation_per_mille: int):
  """A fixed, spread-out subset of block ids (multiplicative hashing).

  Works on Python ints and on int64 tensors, so the ICT task splits the
  corpus exactly as the annotation does.
  """
  return (block_id * 2654435761) % 1000 < validation_per_mille


def _python_block(features: dict) -> dict:
  decode = lambda t: t.numpy().decode('utf-8')
  return {
      'block_id': int(features['block_id']),
      'title': decode(features['title']),
      'body': decode(features['body']),
      'token_ids': features['token_ids'].numpy().tolist(),
      'title_length': int(features['title_length']),
      'sentence_starts': features['sentence_starts'].numpy().tolist(),
      'sentence_ends': features['sentence_ends'].numpy().tolist(),
  }


def annotate_corpus(corpus_dir: str, tokenizer: WordPieceTokenizer,
                    num_processes: int = 1, tagger_dir: str | None = None,
                    max_query_length: int = MAX_QUERY_LENGTH,
                    validation_per_mille: int = 10) -> dict:
  """Writes `<corpus_dir>/annotated/{train,validation}.tfrecord`; returns stats."""
  meta = corpus.load_metadata(corpus_dir)
  corpus.require_vocab(corpus_dir, meta, tokenizer.vocab_path)
  annotator = SpanAnnotator(tokenizer, load_tagger(tagger_dir),
                            max_query_length, num_processes)
  out_dir = os.path.join(corpus_dir, ANNOTATED_DIR)
  tmp_dir = epath.Path(out_dir + '.incomplete')
  if tmp_dir.exists():
    tmp_dir.rmtree()
  tmp_dir.mkdir(parents=True)
  writers = {split: tf.io.TFRecordWriter(str(tmp_dir / f'{split}.tfrecord'))
             for split in ('train', 'validation')}
  counts = collections.Counter()
  siblings = SiblingSpans()
  progress = Progress('annotated', meta['num_blocks'], unit='blocks')

  blocks = (_python_block(f) for f in corpus.read_blocks(corpus_dir))
  for block, spans in annotator.annotate(blocks):
    counts['blocks'] += 1
    progress.update(1)
    held_out = is_validation(block['block_id'], validation_per_mille)
    siblings.add(block, spans, held_out)
    if spans:
      split = 'validation' if held_out else 'train'
      writers[split].write(_annotated_example(block, spans))
      counts[split] += 1
      counts['spans'] += len(spans)
  for writer in writers.values():
    writer.close()
  with_spans = counts['train'] + counts['validation']
  stats = {
      'corpus_fingerprint': meta['corpus_fingerprint'],
      'num_blocks': counts['blocks'],
      'blocks_with_salient_span': with_spans,
      'fraction_with_salient_span': with_spans / max(counts['blocks'], 1),
      'num_spans': counts['spans'],
      'splits': {'train': counts['train'], 'validation': counts['validation']},
      'span_labels': dict(annotator.labels.most_common()),
      'held_out_spans': siblings.as_dict(),
      'max_query_length': max_query_length,
      'skipped': annotator.report.as_dict(),
  }
  (tmp_dir / corpus.METADATA).write_text(json.dumps(stats, indent=1))
  corpus.replace_dir(str(tmp_dir), out_dir)
  labels = ', '.join(f'{k} {v:,}'
                     for k, v in annotator.labels.most_common()[:6])
  held = stats['held_out_spans']
  log.info('%s of %s blocks (%.1f%%) have a salient span; %s spans (%s, '
           '...)\ntrain %s / validation %s blocks in %s; %.1f%% of the %s '
           'held-out spans occur in another block of their article\n%s',
           f'{with_spans:,}', f'{counts["blocks"]:,}',
           100 * stats['fraction_with_salient_span'], f'{counts["spans"]:,}',
           labels, f'{counts["train"]:,}', f'{counts["validation"]:,}',
           out_dir, 100 * held['share_in_a_sibling_block'],
           f'{held["spans"]:,}', annotator.report.summary())
  return stats
