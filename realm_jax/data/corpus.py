"""The knowledge corpus: articles chunked into blocks of at most 288 wordpieces.

As in ORQA and REALM, each article is split into sentences and whole sentences
are packed greedily into blocks `[CLS] title [SEP] body [SEP]` of at most
`max_block_length` wordpieces (288 in the paper; a run that reads shorter
blocks builds its corpus at its own length, so that no text goes unread). The
title is in every block of its article, cut to a quarter of the block at most
(`title_budget`). Blocks get consecutive ids in input order, so
the same input always gives the same ids and fingerprint. The builder streams:
articles are read, tokenized and written a batch at a time, into TFRecord
shards, with `metadata.json` written last. A build goes to a temporary
directory that replaces the output only when complete, so a killed build never
leaves a torn corpus; the output must be new, an empty directory or a corpus,
never a file or a folder of other files, which the build would delete.
"""

import collections
import dataclasses
import functools
import hashlib
import json
import logging
import os
from typing import Iterable, Iterator

import numpy as np
from etils import epath

from realm_jax import errors, extras
from realm_jax.data import sources
from realm_jax.data.skips import SkipReport, is_text, parse_json_object
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.progress import Progress

log = logging.getLogger(__name__)

CORPUS_ROOT_ENV = 'REALM_CORPUS_DIR'
MAX_BLOCK_LENGTH = 288
MAX_TITLE_LENGTH = 64
METADATA = 'metadata.json'
SKIPPED_TITLE_PREFIXES = ('List of', 'Lists of', 'Index of', 'Outline of')
_HISTOGRAM_BUCKET = 32


@dataclasses.dataclass
class Block:
  """One retrieval unit. Sentence offsets are UTF-8 byte offsets into body."""
  block_id: int
  title: str
  body: str
  token_ids: list[int]  # [CLS] title [SEP] body [SEP]
  title_length: int  # Wordpieces of the title.
  sentence_starts: list[int]
  sentence_ends: list[int]

  def to_example(self) -> bytes:
    tf = tensorflow()
    ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    text = lambda s: tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[s.encode('utf-8')]))
    return tf.train.Example(features=tf.train.Features(feature={
        'block_id': ints([self.block_id]),
        'title': text(self.title),
        'body': text(self.body),
        'token_ids': ints(self.token_ids),
        'title_length': ints([self.title_length]),
        'sentence_starts': ints(self.sentence_starts),
        'sentence_ends': ints(self.sentence_ends),
    })).SerializeToString()


def tensorflow():
  """TensorFlow, which the corpus shards (TFRecords) are read and written
  with; the TF-free core reads a corpus's block store instead."""
  return extras.require(
      'tensorflow', 'Reading or writing corpus shards (TFRecords)',
      'read the corpus through its block store (block_store-*/ beside the '
      'shards), written by `realm-jax data export` where TensorFlow is')


def block_features() -> dict:
  """The tf.train.Example features of a block."""
  tf = tensorflow()
  return {
    'block_id': tf.io.FixedLenFeature([], tf.int64),
    'title': tf.io.FixedLenFeature([], tf.string),
    'body': tf.io.FixedLenFeature([], tf.string),
    'token_ids': tf.io.RaggedFeature(tf.int64),
    'title_length': tf.io.FixedLenFeature([], tf.int64),
    'sentence_starts': tf.io.RaggedFeature(tf.int64),
    'sentence_ends': tf.io.RaggedFeature(tf.int64),
  }


def block_parser():
  """The tf.data map function of a shard: a serialized block -> dict of
  tensors. TensorFlow is imported here, outside it: AutoGraph would follow
  the import into importlib, whose source it cannot read, and warn."""
  return functools.partial(tensorflow().io.parse_single_example,
                           features=block_features())


def skipped_page_reason(title: str, text: str) -> str | None:
  """Why a page is not knowledge: lists, indexes, outlines, disambiguation."""
  if title.startswith(SKIPPED_TITLE_PREFIXES):
    return 'list, index or outline page'
  if '(disambiguation)' in title or text.rstrip().endswith('may refer to:'):
    return 'disambiguation page'
  return None


def read_jsonl_articles(paths: Iterable[str], report: SkipReport,
                        progress: Progress | None = None,
                        digest=None) -> Iterator[tuple[str, sources.Article]]:
  """(file:line, article) from JSONL files, one `{"title", "text"}` a line.

  Bad lines are counted in `report` with their file:line. A file with no
  article at all is the wrong file, not a source of nothing: it is refused
  naming it, as is a directory.
  """
  for path in paths:
    errors.require_file(path, 'JSONL file of articles')
    read = 0
    with epath.Path(path).open('rb') as f:
      for number, line in enumerate(f, 1):
        if digest is not None:
          digest.update(line)
        if progress is not None:
          progress.update(len(line) / 1e6)
        where = f'{path}:{number}'
        if not line.strip():
          continue
        row = parse_json_object(line, where, report)
        if row is None:
          continue
        if row.get('title') is None or row.get('text') is None:
          report.add('missing title or text field', where)
          continue
        wrong = [f for f in ('title', 'text') if not isinstance(row[f], str)]
        if wrong:
          report.add(f'{wrong[0]} not a string', where)
          continue
        if not (is_text(row['title']) and is_text(row['text'])):
          report.add('not UTF-8', where)
          continue
        read += 1
        yield where, sources.Article(row['title'].strip(), row['text'])
    if not read:
      raise errors.BadInput(f'{path}: no {{"title", "text"}} article in '
                            'the file. ' + report.summary())


class SentenceSplitter:
  """spaCy's rule-based sentencizer: fast, no model weights."""

  def __init__(self):
    spacy = extras.require('spacy', 'Splitting text into sentences')
    self._nlp = spacy.blank('en')
    self._nlp.add_pipe('sentencizer')

  def split(self, texts: list[str]) -> list[list[str]]:
    return [[s.text.strip() for s in doc.sents if s.text.strip()]
            for doc in self._nlp.pipe(texts, batch_size=256)]


def _lengths(tokenizer: WordPieceTokenizer, texts: list[str]) -> list[list[int]]:
  if not texts:
    return []
  return tokenizer.tokenize(tensorflow().constant(texts)).to_list()


def pack_sentences(lengths: list[int], budget: int) -> list[list[int]]:
  """Greedy packing of whole sentences (by index) into groups <= budget.

  Every sentence must already fit the budget (see `_split_long_sentence`).
  """
  groups, current, used = [], [], 0
  for index, length in enumerate(lengths):
    if current and used + length > budget:
      groups.append(current)
      current, used = [], 0
    current.append(index)
    used += length
  if current:
    groups.append(current)
  return groups


def _split_long_sentence(tokenizer, sentence: str, budget: int) -> list[str]:
  """A sentence over the budget, cut between words into pieces that fit."""
  words = sentence.split()
  pieces, current, used = [], [], 0
  for word, length in zip(words, map(len, _lengths(tokenizer, words))):
    if current and used + length > budget:
      pieces.append(' '.join(current))
      current, used = [], 0
    current.append(word)
    used += length
  if current:
    pieces.append(' '.join(current))
  return pieces


class CorpusBuilder:
  """Turns articles into blocks; see the module docstring."""

  def __init__(self, tokenizer: WordPieceTokenizer,
               max_block_length: int = MAX_BLOCK_LENGTH,
               max_title_length: int = MAX_TITLE_LENGTH):
    if max_block_length < max_title_length + 4:
      raise errors.BadConfig(
          f'max_block_length={max_block_length} leaves no room for a body '
          f'after a {max_title_length}-wordpiece title.')
    self.tokenizer = tokenizer
    self.max_block_length = max_block_length
    self.max_title_length = max_title_length
    self.splitter = SentenceSplitter()
    self.report = SkipReport('build-corpus')
    self.next_id = 0
    # Articles by how many blocks each became (metadata.json).
    self.blocks_per_article: collections.Counter = collections.Counter()

  def blocks(self, articles: list[tuple[str, sources.Article]]) -> list[Block]:
    """Blocks of a batch of (where, article), in order, with fresh ids."""
    kept = []
    for where, article in articles:
      reason = ('empty article' if not article.text.strip() else
                'empty title' if not article.title else
                skipped_page_reason(article.title, article.text))
      if reason:
        self.report.add(reason, where)
      else:
        kept.append((where, article))
    sentences = self.splitter.split([a.text for _, a in kept])
    titles = _lengths(self.tokenizer, [a.title for _, a in kept])
    flat = [s for article_sentences in sentences for s in article_sentences]
    flat_ids = iter(_lengths(self.tokenizer, flat))
    out = []
    for (where, article), title_ids, article_sentences in zip(kept, titles,
                                                              sentences):
      if len(title_ids) > self.max_title_length:
        self.report.add(f'title over {self.max_title_length} wordpieces, cut',
                        where)
        title_ids = title_ids[:self.max_title_length]
      budget = self.max_block_length - len(title_ids) - 3
      texts, ids = [], []
      for sentence in article_sentences:
        sentence_ids = next(flat_ids)
        if len(sentence_ids) <= budget:
          texts.append(sentence)
          ids.append(sentence_ids)
          continue
        self.report.add('sentence longer than a block, cut between words',
                        where)
        for piece in _split_long_sentence(self.tokenizer, sentence, budget):
          texts.append(piece)
          ids.append(_lengths(self.tokenizer, [piece])[0])
      groups = pack_sentences([len(i) for i in ids], budget)
      self.blocks_per_article[len(groups)] += 1
      for group in groups:
        out.append(self._block(article.title, title_ids,
                               [texts[i] for i in group],
                               [ids[i] for i in group]))
    return out

  def _block(self, title, title_ids, sentences, sentence_ids) -> Block:
    t = self.tokenizer
    starts, ends, offset = [], [], 0
    for sentence in sentences:
      starts.append(offset)
      offset += len(sentence.encode('utf-8'))
      ends.append(offset)
      offset += 1  # The joining space.
    token_ids = [t.cls_id, *title_ids, t.sep_id,
                 *(i for ids in sentence_ids for i in ids), t.sep_id]
    block = Block(self.next_id, title, ' '.join(sentences), token_ids,
                  len(title_ids), starts, ends)
    self.next_id += 1
    return block


def vocab_hash(vocab_path: str) -> str:
  return hashlib.sha256(epath.Path(vocab_path).read_bytes()).hexdigest()


def require_vocab(corpus_dir: str, metadata: dict, vocab_path: str) -> None:
  """Refuses a vocab other than the one the corpus was tokenized with:
  wordpieces of another would not match its blocks' token ids."""
  if vocab_hash(vocab_path) != metadata['vocab_hash']:
    raise errors.BadInput(f'{corpus_dir} was built with another vocabulary '
                          f'than {vocab_path}: its blocks would not match.',
                          'Give the vocab the corpus was built with.')


def require_new_or_corpus(output_dir: str) -> None:
  """Refuses to build over anything but nothing, an empty directory or a
  corpus: the build replaces the directory whole, and would delete a file
  or a folder of other files there."""
  path = epath.Path(output_dir)
  if path.is_file():
    raise errors.BadInput(f'{output_dir} is a file, not a corpus directory: '
                          'a corpus built there would replace it.',
                          'Choose a new directory or an existing corpus.')
  if path.is_dir() and any(path.iterdir()) and not (path / METADATA).exists():
    raise errors.BadInput(f'{output_dir} holds files but no corpus '
                          f'({METADATA} missing): a corpus built there would '
                          'delete them.',
                          'Choose a new directory or an existing corpus.')


def length_histogram(lengths: list[int], max_length: int) -> dict[str, int]:
  counts = collections.Counter(min(n, max_length - 1) // _HISTOGRAM_BUCKET
                               for n in lengths)
  return {f'{b * _HISTOGRAM_BUCKET}-{min((b + 1) * _HISTOGRAM_BUCKET, max_length) - 1}':
          counts[b] for b in range(-(-max_length // _HISTOGRAM_BUCKET))}


def format_histogram(histogram: dict[str, int], width: int = 40) -> str:
  top = max(histogram.values()) or 1
  return '\n'.join(f'  {bucket:>9} {count:>9,} {"#" * round(width * count / top)}'
                   for bucket, count in histogram.items())


class CorpusWriter:
  """Writes blocks, in id order, into TFRecord shards of a temporary
  directory, fingerprinting their token ids; `finish` writes metadata.json
  and moves the corpus into place whole."""

  def __init__(self, output_dir: str, vocab_path: str,
               blocks_per_shard: int = 100_000):
    require_new_or_corpus(output_dir)
    self.output_dir = output_dir
    self.tmp_dir = output_dir.rstrip('/') + '.incomplete'
    if epath.Path(self.tmp_dir).exists():
      epath.Path(self.tmp_dir).rmtree()
    epath.Path(self.tmp_dir).mkdir(parents=True)
    self.vocab_hash = vocab_hash(vocab_path)
    self.digest = hashlib.sha256(self.vocab_hash.encode())
    self.blocks_per_shard = blocks_per_shard
    self.lengths, self.shards, self._writer = [], [], None

  def write(self, blocks: Iterable[Block]) -> None:
    for block in blocks:
      if block.block_id != len(self.lengths):
        raise ValueError(f'Block id {block.block_id} written as block '
                         f'{len(self.lengths)}: ids must be consecutive.')
      if (self._writer is None
          or self.shards[-1]['num_blocks'] == self.blocks_per_shard):
        if self._writer is not None:
          self._writer.close()
        name = f'blocks-{len(self.shards):05d}.tfrecord'
        self.shards.append({'path': name, 'num_blocks': 0})
        self._writer = tensorflow().io.TFRecordWriter(
            os.path.join(self.tmp_dir, name))
      self._writer.write(block.to_example())
      self.shards[-1]['num_blocks'] += 1
      self.lengths.append(len(block.token_ids))
      self.digest.update(np.asarray(block.token_ids, np.int32).tobytes())
      self.digest.update(b'|')

  def finish(self, max_block_length: int, **fields) -> dict:
    """Writes metadata.json (the counts, fingerprint and length histogram,
    plus `fields`) and replaces `output_dir` by the new corpus."""
    if self._writer is not None:
      self._writer.close()
    lengths = self.lengths
    metadata = {
        'num_blocks': len(lengths),
        'max_block_length': max_block_length,
        'vocab_hash': self.vocab_hash,
        'corpus_fingerprint': self.digest.hexdigest(),
        'shards': self.shards,
        'length_histogram': length_histogram(lengths, max_block_length),
        'mean_length': float(np.mean(lengths)) if lengths else 0.0,
        **fields,
    }
    (epath.Path(self.tmp_dir) / METADATA).write_text(
        json.dumps(metadata, indent=1))
    replace_dir(self.tmp_dir, self.output_dir)
    return metadata


def title_budget(max_block_length: int) -> int:
  """Wordpieces a title may take in a block: 64 (ORQA's), and never more
  than a quarter of the block, so a 64-wordpiece block keeps 45 for its
  body."""
  return min(MAX_TITLE_LENGTH, max_block_length // 4)


def build_corpus(output_dir: str, tokenizer: WordPieceTokenizer,
                 wiki_leads_json: str | None = None,
                 jsonl_paths: list[str] | None = None,
                 max_block_length: int = MAX_BLOCK_LENGTH,
                 max_title_length: int | None = None,
                 blocks_per_shard: int = 100_000,
                 articles_per_batch: int = 256) -> dict:
  """Builds a corpus from the wiki leads file or JSONL files; returns metadata.

  `max_title_length` None: `title_budget(max_block_length)`.
  """
  if bool(wiki_leads_json) == bool(jsonl_paths):
    raise ValueError('Give exactly one source: wiki_leads_json or jsonl_paths.')
  if max_title_length is None:
    max_title_length = title_budget(max_block_length)
  builder = CorpusBuilder(tokenizer, max_block_length, max_title_length)
  source_digest = hashlib.sha256()
  if wiki_leads_json:
    source_digest.update(epath.Path(wiki_leads_json).read_bytes())
    leads = list(sources.read_wiki_leads(wiki_leads_json))
    progress = Progress('articles', len(leads), unit='articles')
    articles = ((f'{wiki_leads_json}[{a.title!r}]', a) for a in leads)
    count_articles = True
  else:
    for path in jsonl_paths:
      errors.require_file(path, 'JSONL file of articles')
    size = sum(epath.Path(p).stat().length for p in jsonl_paths)
    progress = Progress('read', size / 1e6, unit='MB')
    articles = read_jsonl_articles(jsonl_paths, builder.report, progress,
                                   source_digest)
    count_articles = False

  writer = CorpusWriter(output_dir, tokenizer.vocab_path, blocks_per_shard)
  batch, num_articles = [], 0
  for item in articles:
    batch.append(item)
    num_articles += 1
    if len(batch) == articles_per_batch:
      writer.write(builder.blocks(batch))
      if count_articles:
        progress.update(len(batch))
      batch = []
  writer.write(builder.blocks(batch))
  if count_articles:
    progress.update(len(batch))
  metadata = writer.finish(
      num_articles=num_articles, max_block_length=max_block_length,
      max_title_length=max_title_length,
      blocks_per_article={str(n): count for n, count in sorted(
          builder.blocks_per_article.items())},
      source_fingerprint=source_digest.hexdigest(),
      sources=[wiki_leads_json] if wiki_leads_json else list(jsonl_paths),
      skipped=builder.report.as_dict())
  log.info('%s blocks from %s articles in %s (mean %.0f wordpieces)\n'
           'Block length histogram (wordpieces):\n%s\n%s',
           f'{metadata["num_blocks"]:,}', f'{num_articles:,}', output_dir,
           metadata['mean_length'],
           format_histogram(metadata['length_histogram']),
           builder.report.summary())
  return metadata


def replace_dir(new: str, target: str) -> None:
  """Moves a finished directory into place; readers never see a partial one
  (on a local disk; gs:// renames object by object)."""
  old = epath.Path(target.rstrip('/') + '.old')
  if old.exists():
    old.rmtree()
  if epath.Path(target).exists():
    epath.Path(target).rename(old)
  epath.Path(new).rename(target)
  if old.exists():
    old.rmtree()


def corpus_dir(name: str) -> str:
  """Where corpus `name` lives: $REALM_CORPUS_DIR/name, else runs/corpora/name."""
  return os.path.join(os.environ.get(CORPUS_ROOT_ENV, os.path.join(
      'runs', 'corpora')), name)


def load_metadata(corpus_dir: str) -> dict:
  path = epath.Path(corpus_dir) / METADATA
  if not path.exists():
    raise errors.NotFound(
        f'No corpus at {corpus_dir} ({METADATA} missing); build one with '
        '`realm-jax data build-corpus`.')
  return json.loads(path.read_text())


def shard_paths(corpus_dir: str) -> list[str]:
  return [os.path.join(corpus_dir, s['path'])
          for s in load_metadata(corpus_dir)['shards']]


def read_blocks(corpus_dir: str, start: int = 0):
  """Every block in id order, from block `start` on: only the shards that
  hold those are opened (blocks added to a large corpus, say)."""
  paths, first = [], 0
  for shard in load_metadata(corpus_dir)['shards']:
    if first + shard['num_blocks'] <= start and not paths:
      first += shard['num_blocks']
      continue
    paths.append(os.path.join(corpus_dir, shard['path']))
  return tensorflow().data.TFRecordDataset(paths).skip(start - first).map(
      block_parser())
