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
import codecs
import csv
import hashlib
import json
import logging
import os
import re
from typing import Iterable, Iterator, NamedTuple

import gin
import numpy as np
from etils import epath

from realm_jax import errors
from realm_jax.data.answer_matching import compile_answer_pattern
from realm_jax.data.skips import SkipReport, is_text, parse_json_object

DATA_DIR_ENV = 'REALM_DATA_DIR'
# A question's wordpieces, [CLS] and [SEP] included, past which it is cut.
MAX_QUERY_LENGTH = 64


class QAExample(NamedTuple):
  question: str
  answers: tuple[str, ...]


def _numbered_lines(path) -> Iterator[tuple[int, bytes]]:
  """(number, bytes) of every line, a UTF-8 byte order mark before the
  first dropped: an encoding's mark, not part of the first question."""
  with epath.Path(path).open('rb') as f:
    for number, line in enumerate(f, 1):
      yield number, (line.removeprefix(codecs.BOM_UTF8) if number == 1
                     else line)


def _lines(path) -> Iterator[tuple[int, bytes]]:
  """The lines that hold more than whitespace, as `_numbered_lines`."""
  return ((number, line) for number, line in _numbered_lines(path)
          if line.strip())


def _read_jsonl(path, report) -> Iterator[tuple[str, str, object]]:
  """NQ-open's JSONL: one `{"question": str, "answer": [str, ...]}` a line.

  ORQA reads it so, `json.loads` of each line's bytes (a BOM is taken);
  DPR's JsonlQASrc reads the same objects (its answer field named by a
  setting). Both stop on a blank line, passed over here; a raw tab or line
  break inside a string is invalid JSON to both, counted here.
  """
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    row = parse_json_object(raw, where, report)
    if row is not None:
      yield where, row.get('question'), row.get('answer')


# What `_topics_record` raises on a row that is not one. Python's parser,
# under `ast.literal_eval`, runs out of stack (MemoryError, RecursionError)
# on text such as '-' * 100_000, a few hundred kB of one line; csv raises
# csv.Error on a field over its size limit or a line break outside quotes.
_NOT_A_TOPICS_ROW = (ValueError, SyntaxError, TypeError, MemoryError,
                     RecursionError, csv.Error)


def _universal_newlines(raw: bytes) -> str:
  """A line as Python's text mode reads it, in which DPR opens its files:
  UTF-8, CRLF and CR read as LF. UnicodeDecodeError when not UTF-8."""
  return raw.decode('utf-8').replace('\r\n', '\n').replace('\r', '\n')


def _topics_record(lines: Iterable[bytes]) -> tuple[str, object, int]:
  """(question, answers, lines read) of the topics row that starts
  `lines`: as DPR reads it, csv.reader with a tab delimiter, then the
  answers field evaluated as a Python literal. Raises one of
  `_NOT_A_TOPICS_ROW` when it is not a row of two fields and a literal."""
  reader = csv.reader(map(_universal_newlines, lines), delimiter='\t')
  question, answers = next(reader)
  return question, ast.literal_eval(answers), reader.line_num


def _read_topics_tsv(path, report):
  """Topics TSV (DPR's *.qa.csv, Anserini's and Pyserini's topics.*.txt):
  `question<TAB>answers`, the answers a Python list literal.

  Read as DPR reads them: Python's csv.reader(delimiter='\t'), whose
  quoting runs a field that opens with `"` to its closing `"`, with `""` a
  literal quote and tabs or line breaks inside; then the answers
  evaluated (DPR evals them; `ast.literal_eval` takes the same lists and
  runs no code). Anserini reads the same quoting (commons-csv, trimmed).
  Unlike both: a blank line is passed over, a BOM dropped, a third field
  makes a malformed row. A row read across lines (a quoted line break) is
  noted; a quote that makes no row is counted at its line and the next
  line read on its own, so that it does not swallow the rows after it.
  """
  lines, start = list(_numbered_lines(path)), 0
  while start < len(lines):
    number, raw = lines[start]
    where = f'{path}:{number}'
    read = 1
    try:
      if raw.strip():
        _universal_newlines(raw)  # Not UTF-8: counted as that, not malformed.
        question, answers, read = _topics_record(
            lines[i][1] for i in range(start, len(lines)))
        if read > 1:
          report.add('row across lines', where, skipped=False)
        yield where, question, answers
    except UnicodeDecodeError:
      report.add('not UTF-8', where)
    except _NOT_A_TOPICS_ROW:
      report.add('malformed TSV row', where)
    start += read


def _read_web_questions(path, report):
  """WebQuestions as DrQA splits it (brmson's copy): one JSON list of
  `{"qId", "qText", "answers": [...]}` objects, read whole as `json.load`
  reads it (a BOM taken). DPR's and Pyserini's test set
  (topics.dpr.wq.test.txt) holds the same questions and answers in the same
  order, but for double quotes DPR's conversion dropped. The file is one
  value, so a file that does not parse is refused whole, naming it."""
  try:
    rows = json.loads(epath.Path(path).read_bytes())
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
  """DrQA's CuratedTREC as brmson distributes it: `id<TAB>factoid<TAB>
  question<TAB>answer regex`, with no quoting: a question that opens with a
  double quote keeps it. DPR's and Pyserini's test set
  (topics.dpr.curated.test.txt) holds the same questions and patterns, but
  for no-break spaces DPR's conversion made spaces. The pattern is all
  after the third tab: one holds a tab of its own. CRLF line ends are read
  as LF."""
  for number, raw in _lines(path):
    where = f'{path}:{number}'
    try:
      fields = raw.decode('utf-8').rstrip('\r\n').split('\t', 3)
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
  the rest counted in `report`, by what is missing or of the wrong type.
  Blank answers and answers that are no strings, beside usable ones, are
  dropped."""
  for where, question, answers in rows:
    if question is not None and not isinstance(question, str):
      report.add('question not a string', where)
      continue
    if not (question or '').strip():
      report.add('missing question', where)
      continue
    if answers is not None and not isinstance(answers, list):
      report.add('answers not a list', where)
      continue
    strings = [a for a in answers or () if isinstance(a, str)]
    usable = [a for a in strings if a.strip()]
    if not usable:
      report.add('answer not a string' if len(strings) < len(answers or ())
                 else 'empty answer list', where)
      continue
    answers = usable
    if not all(map(is_text, [question, *answers])):
      report.add('not UTF-8', where)
      continue
    if regex:
      valid = [a for a in answers if _compiles(a)]
      if len(valid) < len(answers):
        report.add('invalid answer regex', where, skipped=not valid)
      if not valid:
        continue
      answers = valid
    report.keep()
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
    if isinstance(_topics_record([raw])[1], list):
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


def query_token_ids(tokenizer, questions: list[str], length: int
                    ) -> np.ndarray:
  """[len(questions), length] int32: each question's `[CLS] x [SEP]`, x cut
  to MAX_QUERY_LENGTH - 2 wordpieces, the whole then cut and padded to
  `length` with 0s. The ids the seqio tasks' tokenize_question and the QA
  feature converter give, without TensorFlow (`tokenizer` a
  WordPieceTokenizer)."""
  ids = np.zeros((len(questions), length), np.int32)
  for row, pieces in enumerate(tokenizer.encode(questions)):
    query = ([tokenizer.cls_id] + pieces[:MAX_QUERY_LENGTH - 2]
             + [tokenizer.sep_id])[:length]
    ids[row, :len(query)] = query
  return ids
