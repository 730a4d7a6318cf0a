"""Hugging Face `tokenizers` beside realm-jax's WordPiece and tensorflow-text.

  python -m benchmarks.wordpiece --corpus_dir=runs/corpora/wiki_leads \
      [--qa_file FILE ...] [--output docs/results/wordpiece.json]

tensorflow-text's BertTokenizer made the corpus and the seqio tasks, so its
ids are the reference. For the titles and bodies of every block of the
corpus, and the questions of each QA file, it counts the texts whose ids
each tokenizer gives exactly, and times each over all the texts: the pure
Python WordPiece (`realm_jax.data.wordpiece`, from a fresh instance, so its
word cache starts empty) and Hugging Face's BertWordPieceTokenizer
(lower-cased, accents stripped, Chinese characters split, as BERT's
uncased vocab asks; `encode_batch`, which uses every core). It shows the
first texts where Hugging Face differs.
"""

import argparse
import json
import os
import time

import tokenizers

from benchmarks.run import table
from realm_jax import default_files
from realm_jax.data import block_store, open_qa
from realm_jax.data.tokenization import WordPieceTokenizer

_SHOWN = 8


def _tf_text(tokenizer: WordPieceTokenizer, texts: list[str]
             ) -> list[list[int]]:
  return [list(ids) for ids in tokenizer.tokenize(texts).numpy()]


def _timed(function, texts):
  start = time.perf_counter()
  ids = function(texts)
  return ids, time.perf_counter() - start


def compare(name: str, texts: list[str], vocab: str) -> dict:
  """One row: how many of `texts` each tokenizer gives tf-text's ids for,
  and its seconds over all of them."""
  reference, tf_s = _timed(lambda t: _tf_text(WordPieceTokenizer(vocab), t),
                           texts)
  python, python_s = _timed(WordPieceTokenizer(vocab).encode, texts)
  hugging_face = tokenizers.BertWordPieceTokenizer(
      vocab, lowercase=True, strip_accents=True, clean_text=True,
      handle_chinese_chars=True)
  hf, hf_s = _timed(lambda t: [e.ids for e in hugging_face.encode_batch(
      t, add_special_tokens=False)], texts)
  differ = [i for i, (a, b) in enumerate(zip(reference, hf)) if a != b]
  return {
      'texts': name, 'count': len(texts),
      'wordpieces': sum(map(len, reference)),
      'python same as tf-text': sum(a == b for a, b in zip(reference,
                                                           python)),
      'hugging face same as tf-text': len(texts) - len(differ),
      'tf-text s': round(tf_s, 2), 'python s': round(python_s, 2),
      'hugging face s': round(hf_s, 2),
      'hugging face differs on': [
          _parting(WordPieceTokenizer(vocab).vocab, reference[i], hf[i])
          for i in differ[:_SHOWN]]}


def _parting(words: list[str], reference: list[int], other: list[int]
             ) -> dict:
  """The wordpieces around where two tokenizations of a text part."""
  at = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b),
            min(len(reference), len(other)))
  shown = lambda ids: ' '.join(words[i] for i in ids[max(0, at - 5):at + 8])
  return {'wordpiece': at, 'tf-text': shown(reference),
          'hugging face': shown(other)}


def measure(corpus_dir: str, qa_files=(), vocab: str | None = None
            ) -> list[dict]:
  vocab = vocab or os.fspath(default_files.task_vocab())
  store = block_store.open_store(corpus_dir)
  blocks = range(store.num_blocks)
  rows = [compare('titles', [store.title(i) for i in blocks], vocab),
          compare('bodies', [store.body(i) for i in blocks], vocab)]
  for path in qa_files:
    rows.append(compare(os.path.basename(path), [
        example.question for example in open_qa.load_file(path)], vocab))
  return rows


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.wordpiece',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('--corpus_dir', required=True)
  parser.add_argument('--qa_file', action='append', default=[])
  parser.add_argument('--output', default=None)
  args = parser.parse_args(argv)
  # pylint: disable-next=g-import-not-at-top
  from realm_jax.experiments import machine as machine_lib
  rows = measure(args.corpus_dir, args.qa_file)
  result = {'machine': machine_lib.machine(), 'tokenizers': tokenizers.__version__,
            'rows': rows}
  print(table([{k: v for k, v in row.items() if k != 'hugging face differs on'}
               for row in rows]))
  for row in rows:
    for shown in row['hugging face differs on']:
      print(f'{row["texts"]}, from wordpiece {shown["wordpiece"]}:\n'
            f'  tf-text:      {shown["tf-text"]}\n'
            f'  hugging face: {shown["hugging face"]}')
  print(json.dumps(result['machine']))
  if args.output:
    with open(args.output, 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=1, ensure_ascii=False)
  return result


if __name__ == '__main__':
  main()
