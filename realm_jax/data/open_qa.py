"""The Open-QA benchmarks of the paper, read from a local data directory.

The directory is laid out like `../shared/data` (see its README):
nq_open/, web_questions/, curated_trec/. Pass it explicitly or set
REALM_DATA_DIR. NQ's 79k training file is not distributed offline; the 8,757
questions of `topics.nq.dev.txt` (ORQA's dev split, carved from train) are the
training split here, and `NQ-open.dev.jsonl` (3,610) is the test set every
Open-QA paper reports.
"""

import ast
import json
import logging
import os
from typing import Iterator, NamedTuple

import gin
from etils import epath

from realm_jax.data.answer_matching import compile_answer_pattern
from realm_jax.data.skips import SkipReport, parse_json_line

DATA_DIR_ENV = 'REALM_DATA_DIR'


class QAExample(NamedTuple):
  question: str
  answers: tuple[str, ...]


def _lines(path) -> Iterator[tuple[int, bytes]]:
  with epath.Path(path).open('rb') as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        yield number, line


def _read_jsonl(path, report) -> Iterator[tuple[str, str, object]]:
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    row = parse_json_line(raw, where, report)
    if isinstance(row, dict):
      yield where, row.get('question'), row.get('answer')
    elif row is not None:
      report.add('not a JSON object', where)


def _read_topics_tsv(path, report):
  """Anserini topics: `question<TAB>['answer', ...]` (a Python list)."""
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    try:
      question, answers = raw.decode('utf-8').rstrip('\n').split('\t')
      answers = ast.literal_eval(answers)
    except UnicodeDecodeError:
      report.add('not UTF-8', where)
      continue
    except (ValueError, SyntaxError):
      report.add('malformed TSV row', where)
      continue
    yield where, question, answers


def _read_web_questions(path, report):
  rows = json.loads(epath.Path(path).read_text())
  for number, row in enumerate(rows):
    yield f'{path}[{number}]', row.get('qText'), row.get('answers')


def _read_trec_tsv(path, report):
  """DrQA's CuratedTREC: `id<TAB>factoid<TAB>question<TAB>answer regex`."""
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    try:
      # maxsplit: one pattern in the file holds a tab of its own.
      fields = raw.decode('utf-8').rstrip('\n').split('\t', 3)
    except UnicodeDecodeError:
      report.add('not UTF-8', where)
      continue
    if len(fields) != 4:
      report.add('malformed TSV row', where)
      continue
    yield where, fields[2], [fields[3]]


# benchmark -> split -> [(file, reader)]
FILES = {
    'nq_open': {
        'train': [('nq_open/topics.nq.dev.txt', _read_topics_tsv)],
        'test': [('nq_open/NQ-open.dev.jsonl', _read_jsonl)],
    },
    'web_questions': {
        'train': [(f'web_questions/{name}.json', _read_web_questions)
                  for name in ('trainmodel', 'val', 'devtest')],
        'test': [('web_questions/test.json', _read_web_questions)],
    },
    'curated_trec': {
        'train': [('curated_trec/large2180-train.tsv', _read_trec_tsv)],
        'test': [('curated_trec/large2180-test.tsv', _read_trec_tsv)],
    },
}
# CuratedTREC answers are regular expressions, not strings.
REGEX_ANSWERS = frozenset({'curated_trec'})


@gin.configurable
def data_dir(explicit: str | None = None) -> str:
  """The benchmark directory: `explicit`, a gin binding, or $REALM_DATA_DIR."""
  path = explicit or os.environ.get(DATA_DIR_ENV)
  if not path:
    raise FileNotFoundError(
        f'No Open-QA data directory: pass one or set {DATA_DIR_ENV} to a '
        'directory laid out like shared/data (nq_open/, web_questions/, '
        'curated_trec/).')
  return path


def load(benchmark: str, split: str, directory: str | None = None,
         report: SkipReport | None = None) -> list[QAExample]:
  """Every usable question of one split; the rest is counted in `report`.

  Rows with no question, no answers, or (CuratedTREC) no valid answer pattern
  are skipped; invalid patterns next to valid ones are dropped. Both are
  counted, never raised.
  """
  if benchmark not in FILES or split not in FILES[benchmark]:
    raise ValueError(f'Unknown Open-QA split {benchmark}/{split}; known: '
                     + ', '.join(f'{b}/{s}' for b in FILES for s in FILES[b]))
  own_report = report is None
  if own_report:
    report = SkipReport(f'{benchmark}/{split}')
  root = data_dir(directory)
  examples = []
  for name, reader in FILES[benchmark][split]:
    path = os.path.join(root, name)
    if not epath.Path(path).exists():
      raise FileNotFoundError(f'{benchmark}/{split}: missing {path}')
    for where, question, answers in reader(path, report):
      if not isinstance(question, str) or not question.strip():
        report.add('missing question', where)
        continue
      if not isinstance(answers, list) or not any(
          isinstance(a, str) and a.strip() for a in answers):
        report.add('empty answer list', where)
        continue
      answers = [a for a in answers if isinstance(a, str) and a.strip()]
      if benchmark in REGEX_ANSWERS:
        valid = [a for a in answers if compile_answer_pattern(a) is not None]
        if len(valid) < len(answers):
          report.add('invalid answer regex', where)
        if not valid:
          continue
        answers = valid
      examples.append(QAExample(question.strip(), tuple(answers)))
  if own_report and report:
    logging.warning('%s', report.summary())
  return examples
