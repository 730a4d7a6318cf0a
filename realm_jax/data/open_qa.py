"""The Open-QA benchmarks of the paper, read from a local data directory.

The directory is laid out like `../shared/data` (see its README):
nq_open/, web_questions/, curated_trec/. Pass it explicitly or set
REALM_DATA_DIR. NQ's 79k training file is not distributed offline; the 8,757
questions of `topics.nq.dev.txt` (ORQA's dev split, carved from train) are the
training split here, and `NQ-open.dev.jsonl` (3,610) is the test set every
Open-QA paper reports.

Any other Open-QA file reads through `load_file`, in either format of those
benchmarks: Anserini's topics TSV or NQ-open's JSONL, its answers strings or
(like CuratedTREC's) regular expressions.
"""

import ast
import hashlib
import json
import logging
import os
import re
from typing import Iterator, NamedTuple

import gin
from etils import epath

from realm_jax import errors
from realm_jax.data.answer_matching import compile_answer_pattern
from realm_jax.data.skips import SkipReport, is_text, parse_json_object

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
    row = parse_json_object(raw, where, report)
    if row is not None:
      yield where, row.get('question'), row.get('answer')


# What `_topics_row` raises on a row that is not one. Python's parser, under
# `ast.literal_eval`, runs out of stack (MemoryError, RecursionError) on text
# such as '-' * 100_000, a few hundred kB of one line.
_NOT_A_TOPICS_ROW = (ValueError, SyntaxError, TypeError, MemoryError,
                     RecursionError)


def _topics_row(raw: bytes) -> tuple[str, object]:
  """(question, answers) of a topics row; one of `_NOT_A_TOPICS_ROW` when it
  is not one (UnicodeDecodeError, a ValueError, when not UTF-8)."""
  question, answers = raw.decode('utf-8').rstrip('\n').split('\t')
  return question, ast.literal_eval(answers)


def _read_topics_tsv(path, report):
  """Anserini topics: `question<TAB>['answer', ...]` (a Python list)."""
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    try:
      question, answers = _topics_row(raw)
    except UnicodeDecodeError:
      report.add('not UTF-8', where)
      continue
    except _NOT_A_TOPICS_ROW:
      report.add('malformed TSV row', where)
      continue
    yield where, question, answers


def _read_web_questions(path, report):
  """WebQuestions: one JSON list of `{"qText", "answers"}` objects. The file
  is one value, so a file that does not parse is refused whole, naming it."""
  try:
    rows = json.loads(epath.Path(path).read_bytes().decode('utf-8'))
  except (ValueError, RecursionError) as error:  # Not UTF-8, or not JSON.
    raise errors.BadInput(f'{path}: not a JSON file ({error}).') from None
  if not isinstance(rows, list):
    raise errors.BadInput(f'{path}: expected a JSON list of questions, got '
                          f'{type(rows).__name__}.')
  for number, row in enumerate(rows):
    where = f'{path}[{number}]'
    if isinstance(row, dict):
      yield where, row.get('qText'), row.get('answers')
    else:
      report.add('not a JSON object', where)


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
    raise errors.NotFound(
        f'No Open-QA data directory: pass one or set {DATA_DIR_ENV} to a '
        'directory laid out like shared/data (nq_open/, web_questions/, '
        'curated_trec/).')
  return path


def _compiles(pattern: str) -> bool:
  """Is `pattern` a valid answer regex? Besides re.error, `re` raises
  OverflowError on a repeat such as a{99999999999} and RecursionError on
  groups nested a thousand deep."""
  try:
    return compile_answer_pattern(pattern) is not None
  except (OverflowError, RecursionError):
    return False


def _usable(rows, regex: bool, report: SkipReport) -> Iterator[QAExample]:
  """The rows with a question and an answer (a valid pattern when `regex`);
  the rest counted in `report`."""
  for where, question, answers in rows:
    if not isinstance(question, str) or not question.strip():
      report.add('missing question', where)
      continue
    if not isinstance(answers, list) or not any(
        isinstance(a, str) and a.strip() for a in answers):
      report.add('empty answer list', where)
      continue
    answers = [a for a in answers if isinstance(a, str) and a.strip()]
    if not all(map(is_text, [question, *answers])):
      report.add('not UTF-8', where)
      continue
    if regex:
      valid = [a for a in answers if _compiles(a)]
      if len(valid) < len(answers):
        report.add('invalid answer regex', where)
      if not valid:
        continue
      answers = valid
    yield QAExample(question.strip(), tuple(answers))


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
    if not epath.Path(path).is_file():
      raise errors.NotFound(f'{benchmark}/{split}: missing {path}'
                            + _directory_note(path))
    read = list(_usable(reader(path, report), benchmark in REGEX_ANSWERS,
                        report))
    if not read:
      raise errors.BadInput(f'{benchmark}/{split}: no usable question in '
                            f'{path}. ' + report.summary())
    examples.extend(read)
  if own_report and report:
    logging.warning('%s', report.summary())
  return examples


# The formats of an Open-QA file, and the extensions that name them.
QA_FILE_READERS = {'tsv': _read_topics_tsv, 'jsonl': _read_jsonl}
QA_FILE_EXTENSIONS = {'.tsv': 'tsv', '.jsonl': 'jsonl'}
# A file's splits: 'test' is every question, 'validation' the share held
# out of 'train' (per mille of the questions).
QA_FILE_SPLITS = ('train', 'validation', 'test')
QA_FILE_VALIDATION_PER_MILLE = 50


def _row_format(raw: bytes) -> str | None:
  """The format one row reads as: 'jsonl', 'tsv' or None."""
  try:
    if isinstance(json.loads(raw.decode('utf-8')), dict):
      return 'jsonl'
  except (ValueError, RecursionError):  # Not UTF-8, not JSON, too deep.
    pass
  try:
    if isinstance(_topics_row(raw)[1], list):
      return 'tsv'
  except _NOT_A_TOPICS_ROW:
    pass
  return None


def _directory_note(path) -> str:
  """' (a directory)' where `path` is one: 'missing' alone would puzzle."""
  return ' (a directory)' if epath.Path(path).is_dir() else ''


def qa_file_format(path) -> str:
  """'tsv' or 'jsonl': what the file's first row reads as, else what its
  extension says (the first row is then a bad row, such as a header).

  Raises:
    FileNotFoundError: no such file (or a directory).
    ValueError: neither says, or the file is empty; names the file and line.
  """
  if not epath.Path(path).is_file():
    raise errors.NotFound(f'No Open-QA file {path}{_directory_note(path)}.')
  first = next(_lines(path), None)
  if first is None:
    raise errors.BadInput(f'{path}: no question in the file.')
  number, raw = first
  found = _row_format(raw) or QA_FILE_EXTENSIONS.get(
      epath.Path(path).suffix.lower())
  if found is None:
    raise errors.BadInput(
        f'{path}:{number}: not an Open-QA row: expected a topics TSV row '
        "(question<TAB>['answer', ...]) or a JSONL row ({\"question\": ..., "
        f'"answer": [...]}}), got '
        f'{raw[:80].decode("utf-8", "replace").rstrip()!r}.')
  return found


def held_out(question: str) -> bool:
  """Is a file's question in its validation split? A fixed share of the
  questions, by a hash of the text: the same under any order of the rows,
  and a question asked twice is held out both times or neither."""
  digest = hashlib.sha256(question.encode('utf-8')).digest()
  return (int.from_bytes(digest[:4], 'big') % 1000
          < QA_FILE_VALIDATION_PER_MILLE)


def load_file(path, regex: bool = False, split: str = 'test',
              report: SkipReport | None = None) -> list[QAExample]:
  """The usable questions of one split of an Open-QA file (see
  `QA_FILE_SPLITS`), read in the format `qa_file_format` finds.

  `regex`: the answers are regular expressions (scored by regex match, as
  CuratedTREC's are). Bad rows are skipped and counted in `report` with
  their file:line, as `load` counts them.

  Raises:
    ValueError: the file is of no known format, or holds no usable question
      (in `split`).
  """
  if split not in QA_FILE_SPLITS:
    raise ValueError(f'Unknown split {split!r} of {path}; known: '
                     + ', '.join(QA_FILE_SPLITS))
  found = qa_file_format(path)
  own_report = report is None
  if own_report:
    report = SkipReport(f'{path} ({split})')
  examples = list(_usable(QA_FILE_READERS[found](path, report), regex,
                          report))
  if not examples:
    raise errors.BadInput(f'{path}: no usable question, read as {found}. '
                          + report.summary())
  if own_report and report:
    logging.warning('%s', report.summary())
  if split == 'test':
    return examples
  chosen = [e for e in examples if held_out(e.question) == (
      split == 'validation')]
  if not chosen:
    raise errors.BadInput(
        f'{path}: none of its {len(examples)} questions falls in its {split} '
        f'split ({QA_FILE_VALIDATION_PER_MILLE / 10:g}% are held out for '
        'validation, by a hash of the question).')
  return chosen


def qa_file_task_name(path: str, regex: bool = False) -> str:
  """qa_file_<stem>[_regex]_<8 hex digits of the content's SHA-256>: the
  same file names the same task in every process, and an edited one
  another (a resumed fine-tuning run then refuses the changed data)."""
  path = epath.Path(path)
  if not path.exists():
    raise errors.NotFound(f'No Open-QA file {path}.')
  stem = re.sub(r'[^0-9a-z_]', '_', path.stem.lower())
  digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
  return f'qa_file_{stem}{"_regex" if regex else ""}_{digest}'
