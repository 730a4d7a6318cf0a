"""Fuzzed inputs of every parser: the corpus JSONL, the Open-QA formats
(topics TSV, NQ-open JSONL, CuratedTREC's regex answers), gin bindings on the
command line and the launch TOML.

Files mix valid rows with bad ones. The valid rows load exactly; each bad
row is counted once, at its file:line; a file with nothing usable, a
directory or a missing file is refused with a ValueError (or
FileNotFoundError, or the launcher's ConfigError) naming it. Any other
exception is a parser bug. The examples each test ran are counted and
printed at the end of the module.
"""

import ast
import collections
import csv
import dataclasses
import io
import json
import os
import re
import tempfile
import tomllib

import gin
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launch import config as config_lib
from realm_jax import main
from realm_jax.cli import common
from realm_jax.data import corpus, open_qa, sources
from realm_jax.data.skips import SkipReport

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, 'launch', 'configs', 'paper_v4.toml')

# Examples run, by test: printed when the module ends.
CASES: collections.Counter = collections.Counter()


def fuzz(max_examples: int):
  """Hypothesis settings of a fuzz test: no deadline (the first example of a
  test pays for imports), the budget given, and the same examples on every
  run, so that CI's verdict does not depend on a draw (a run without
  `derandomize` explores further)."""
  return settings(max_examples=max_examples, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.data_too_large])


@pytest.fixture(scope='module', autouse=True)
def _report_cases(pytestconfig):
  yield
  plugins = pytestconfig.pluginmanager
  reporter = plugins.get_plugin('terminalreporter')
  if reporter is None or not CASES:
    return
  with plugins.get_plugin('capturemanager').global_and_fixture_disabled():
    reporter.write_line('\nfuzz cases: ' + ', '.join(
        f'{name} {count}' for name, count in sorted(CASES.items()))
                        + f'; {sum(CASES.values())} in all')


@pytest.fixture(scope='module')
def fuzz_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp('fuzz'))


def _fresh(root: str) -> str:
  """A new empty directory for one example."""
  return tempfile.mkdtemp(dir=root)


class EveryLocation(SkipReport):
  """A SkipReport that keeps the location of every skip, in order, where
  the summary keeps a few of each reason."""

  def __init__(self):
    super().__init__('fuzz')
    self.locations: list[str] = []

  def add(self, reason: str, where: str = '', skipped: bool = True) -> None:
    super().add(reason, where, skipped)
    self.locations.append(where)


# --- Text ------------------------------------------------------------------

# Any code point UTF-8 holds (all but the surrogates), control and odd
# characters included.
CHARS = st.characters(codec='utf-8')
TEXT = st.text(CHARS, max_size=40)
# Some text beyond whitespace, which the readers strip.
SOME_TEXT = st.text(CHARS, min_size=1, max_size=40).filter(str.strip)
# A field of a TSV row: no tab, no newline.
FIELD = st.text(st.characters(codec='utf-8', exclude_characters='\t\n'),
                max_size=30)
SOME_FIELD = FIELD.filter(str.strip)
# A TSV question: a row starting '{' could read as a JSONL row, and the first
# row decides the format of a file.
TSV_QUESTION = SOME_FIELD.filter(lambda q: not q.lstrip().startswith('{'))
# The question of a bad topics row: one opening with a double quote would
# open a csv field that could run into the next row.
BARE_QUESTION = TSV_QUESTION.filter(lambda q: not q.startswith('"'))
# A line of anything but a newline.
LINE_TEXT = st.text(st.characters(codec='utf-8', exclude_characters='\n'),
                    max_size=40)
BLANK_LINE = st.sampled_from([b'', b' ', b'\t', b'  \t \r', b'\r'])
NOT_UTF8 = st.binary(max_size=30).map(
    lambda b: b'\xff' + b.replace(b'\n', b''))

# Lines no JSON parser, or Python's, can take whole.
DEEP = st.integers(1_000, 100_000)
JSON_TOO_DEEP = DEEP.map(lambda n: '[' * n)
JSON_HUGE_INT = st.integers(4_301, 6_000).map(
    lambda n: '{"question": "q", "answer": [' + '9' * n + ']}')
# A JSON line cut short: no closing brace, so never an object.
JSON_CUT = st.text(st.characters(codec='utf-8', exclude_characters='}\n\t'),
                   max_size=40).map(lambda s: '{"question": ' + s)
JSON_NOT_OBJECT = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
    TEXT, st.lists(st.integers(), max_size=3)).map(json.dumps)
# Not a question: absent, of another type, or blank.
NO_QUESTION = st.one_of(st.none(), st.integers(), st.lists(TEXT, max_size=2),
                        st.sampled_from(['', ' ', '\t', '\u3000\n']))
# Not a list with some answer text.
NO_ANSWERS = st.one_of(
    st.none(), st.integers(), TEXT, st.dictionaries(TEXT, TEXT, max_size=2),
    st.lists(st.one_of(st.sampled_from(['', ' ', '\t\n']), st.integers(),
                       st.none(), st.booleans()), max_size=4))
LONE_SURROGATE = st.sampled_from(['\ud800', 'caf\udce9', '\udfff end'])


def _good_answers(answers: st.SearchStrategy):
  """A list holding some answer text, with junk beside it: blank strings,
  numbers, None (dropped by the readers)."""
  junk = st.one_of(st.sampled_from(['', '  ']), st.integers(), st.none())
  return st.tuples(answers, st.lists(st.one_of(answers, junk), max_size=4),
                   st.integers(0, 4)).map(
                       lambda t: [*t[1][:t[2]], t[0], *t[1][t[2]:]])


def _kept(answers: list) -> tuple[str, ...]:
  return tuple(a for a in answers if isinstance(a, str) and a.strip())


# --- Rows ------------------------------------------------------------------
# A row is ('good', line, expected), ('bad', line) or ('blank', line): line
# in bytes without its newline, expected what the reader returns for it.


def _jsonl_qa_row(regex: bool):
  answers = st.text(st.characters(codec='utf-8'), min_size=1,
                    max_size=20).filter(str.strip)
  if regex:
    answers = answers.map(re.escape)
  good = st.tuples(SOME_TEXT, _good_answers(answers), st.booleans()).map(
      lambda t: ('good', json.dumps({'question': t[0], 'answer': t[1]},
                                    ensure_ascii=t[2]).encode(),
                 open_qa.QAExample(t[0].strip(), _kept(t[1]))))
  bad_lines = [
      NOT_UTF8,
      st.one_of(JSON_CUT, JSON_NOT_OBJECT, JSON_TOO_DEEP,
                JSON_HUGE_INT).map(str.encode),
      st.tuples(NO_QUESTION, _good_answers(SOME_TEXT)).map(
          lambda t: json.dumps({'question': t[0], 'answer': t[1]}).encode()),
      st.tuples(SOME_TEXT, NO_ANSWERS).map(
          lambda t: json.dumps({'question': t[0], 'answer': t[1]}).encode()),
      st.dictionaries(st.sampled_from(['q', 'answers', 'text']), TEXT).map(
          lambda d: json.dumps(d).encode()),
      LONE_SURROGATE.map(lambda s: json.dumps(
          {'question': s, 'answer': ['a']}).encode()),
      LONE_SURROGATE.map(lambda s: json.dumps(
          {'question': 'q', 'answer': [s]}).encode()),
  ]
  if regex:
    bad_lines.append(st.lists(INVALID_REGEX, min_size=1, max_size=3).map(
        lambda p: json.dumps({'question': 'q', 'answer': p}).encode()))
  return st.one_of(good, st.one_of(bad_lines).map(lambda b: ('bad', b)),
                   BLANK_LINE.map(lambda b: ('blank', b)))


def _csv_row(*fields: str) -> str:
  """A TSV row as the csv module writes DPR's files: a field in double
  quotes where it holds a tab, a quote or a line break, `""` a quote."""
  out = io.StringIO()
  csv.writer(out, delimiter='\t').writerow(fields)
  return out.getvalue().removesuffix('\r\n')


def _text_mode(text: str) -> str:
  """`text` as Python's text mode reads it, in which DPR opens its files."""
  return text.replace('\r\n', '\n').replace('\r', '\n')


def _topics_row():
  good = st.tuples(TSV_QUESTION, _good_answers(SOME_TEXT)).map(
      lambda t: ('good', _csv_row(t[0], repr(t[1])).encode(),
                 open_qa.QAExample(_text_mode(t[0]).strip(), _kept(t[1]))))
  question = BARE_QUESTION
  bad = st.one_of(
      NOT_UTF8,
      # No tab; no '{', which could make the row JSON; no opening quote.
      st.text(st.characters(codec='utf-8', exclude_characters='\t\n{'),
              min_size=1, max_size=40).filter(str.strip).filter(
                  lambda s: not s.startswith('"')).map(str.encode),
      # Too many columns.
      st.tuples(question, FIELD).map(
          lambda t: f"{t[0]}\t['a']\t{t[1]}".encode()),
      # Not a Python literal: a list never closed.
      st.tuples(question, st.text(st.characters(
          codec='utf-8', exclude_characters=']\n'), max_size=30)).map(
              lambda t: f'{t[0]}\t[{t[1]}'.encode()),
      # Literals that run Python's parser out of stack.
      st.tuples(question, DEEP).map(
          lambda t: f"{t[0]}\t[{'-' * t[1]}'a']".encode()),
      st.tuples(question, DEEP).map(
          lambda t: f'{t[0]}\t{"+".join(["1"] * t[1])}'.encode()),
      st.tuples(question, DEEP).map(lambda t: f'{t[0]}\t{"[" * t[1]}'.encode()),
      st.tuples(question, st.integers(4_301, 6_000)).map(
          lambda t: f'{t[0]}\t[{"9" * t[1]}]'.encode()),
      # A literal, but no list of answers.
      st.tuples(question, NO_ANSWERS).map(
          lambda t: f'{t[0]}\t{t[1]!r}'.encode()),
      st.just(b"q\t{[]: 1}"),
      st.sampled_from(['', ' ', '\u3000']).map(
          lambda q: f"{q}\t['a']".encode()),
      LONE_SURROGATE.map(lambda s: f'q\t[{s!r}]'.encode()),
  )
  return st.one_of(good, bad.map(lambda b: ('bad', b)),
                   BLANK_LINE.map(lambda b: ('blank', b)))


# Not a pattern `re` compiles: its errors, and the OverflowError and
# RecursionError it raises besides.
INVALID_REGEX = st.one_of(
    st.sampled_from(['(', '[a-', 'a)', '*', 'a{2,1}', '(?P<1>x)', '\\',
                     'a(?i)', 'a{99999999999}', '(?<=a+)b']),
    st.integers(1_000, 3_000).map(lambda n: '(' * n + ')' * n))


def _trec_row():
  pattern = st.text(st.characters(codec='utf-8', exclude_characters='\n'),
                    min_size=1, max_size=20).filter(str.strip).map(re.escape)
  good = st.tuples(FIELD, FIELD, TSV_QUESTION, pattern).map(
      lambda t: ('good', '\t'.join(t).encode(),
                 open_qa.QAExample(t[2].strip(), (t[3],))))
  bad = st.one_of(
      NOT_UTF8,
      st.lists(FIELD, min_size=1, max_size=3).map(
          lambda f: '\t'.join(f).encode()).filter(bytes.strip),
      st.sampled_from(['', ' ']).map(lambda q: f'1\tf\t{q}\tok'.encode()),
      st.sampled_from(['', ' ', '\t ']).map(lambda p: f'1\tf\tq\t{p}'.encode()),
      INVALID_REGEX.map(lambda p: f'1\tf\tq\t{p}'.encode()),
  )
  return st.one_of(good, bad.map(lambda b: ('bad', b)),
                   BLANK_LINE.map(lambda b: ('blank', b)))


def _write_rows(path: str, rows, end: bytes = b'\n') -> None:
  with open(path, 'wb') as f:
    f.write(b'\n'.join(row[1] for row in rows) + (end if rows else b''))


def _expected(path: str, rows):
  """(the examples a reader returns, the file:line of each bad row)."""
  good = [row[2] for row in rows if row[0] == 'good']
  bad = [f'{path}:{number}' for number, row in enumerate(rows, 1)
         if row[0] == 'bad']
  return good, bad


def _check_load_file(path: str, rows, regex: bool = False,
                     split: str = 'test') -> None:
  """open_qa.load_file on the file of `rows`: the good rows in `split`, every
  bad one counted where it is, or a ValueError naming the file."""
  good, bad = _expected(path, rows)
  if split != 'test':
    good = [e for e in good
            if open_qa.held_out(e.question) == (split == 'validation')]
  report = EveryLocation()
  if not good:
    with pytest.raises(ValueError) as error:
      open_qa.load_file(path, regex=regex, split=split, report=report)
    assert path in str(error.value)
  else:
    assert open_qa.load_file(path, regex=regex, split=split,
                             report=report) == good
  assert report.locations == bad


def _check_load(root: str, benchmark: str, split: str, path: str,
                rows) -> None:
  """open_qa.load of a benchmark split in `root`, one file of `rows`."""
  good, bad = _expected(path, rows)
  report = EveryLocation()
  if not good:
    with pytest.raises(ValueError) as error:
      open_qa.load(benchmark, split, root, report)
    assert path in str(error.value)
  else:
    assert open_qa.load(benchmark, split, root, report) == good
  assert report.locations == bad


# --- Open-QA files ---------------------------------------------------------


@fuzz(200)
@given(rows=st.lists(_jsonl_qa_row(regex=False), max_size=8),
       end=st.sampled_from([b'\n', b'', b'\n\n']),
       split=st.sampled_from(open_qa.QA_FILE_SPLITS))
def test_nq_open_jsonl(fuzz_root, rows, end, split):
  CASES['nq_open_jsonl'] += 1
  root = _fresh(fuzz_root)
  os.mkdir(os.path.join(root, 'nq_open'))
  path = os.path.join(root, 'nq_open', 'NQ-open.dev.jsonl')
  _write_rows(path, rows, end)
  _check_load(root, 'nq_open', 'test', path, rows)
  _check_load_file(path, rows, split=split)


@fuzz(200)
@given(rows=st.lists(_topics_row(), max_size=8),
       split=st.sampled_from(open_qa.QA_FILE_SPLITS))
def test_topics_tsv(fuzz_root, rows, split):
  CASES['topics_tsv'] += 1
  root = _fresh(fuzz_root)
  os.mkdir(os.path.join(root, 'nq_open'))
  path = os.path.join(root, 'nq_open', 'topics.nq.dev.txt')
  _write_rows(path, rows)
  _check_load(root, 'nq_open', 'train', path, rows)
  tsv = os.path.join(root, 'topics.tsv')  # load_file: .tsv names the format.
  _write_rows(tsv, rows)
  _check_load_file(tsv, rows, split=split)


# A topics row that the csv module writes: any question, answers of any text.
CSV_ROW = st.tuples(st.text(CHARS, max_size=30),
                    st.lists(SOME_TEXT, min_size=1, max_size=4)).map(
                        lambda t: _csv_row(t[0], repr(t[1])))
# A line of anything but a quote or a line break, such as a header or a note:
# csv reads it as one row of its own.
OTHER_LINE = st.text(st.characters(codec='utf-8', exclude_characters='"\r\n'),
                     max_size=40)


@fuzz(200)
@given(lines=st.lists(st.one_of(CSV_ROW, OTHER_LINE), max_size=8),
       end=st.sampled_from(['\n', '\r\n']))
def test_a_topics_row_that_csv_reads_is_never_skipped(fuzz_root, lines, end):
  """Every row that DPR's reading (csv.reader with a tab delimiter, on the
  file in text mode) makes a question and a non-empty list of strings is
  read, with the same question and answers."""
  CASES['topics_csv_rows'] += 1
  root = _fresh(fuzz_root)
  os.mkdir(os.path.join(root, 'nq_open'))
  path = os.path.join(root, 'nq_open', 'topics.nq.dev.txt')
  with open(path, 'w', encoding='utf-8', newline='') as f:
    f.write(''.join(line + end for line in lines))
  expected = []
  with open(path, encoding='utf-8') as f:
    for row in csv.reader(f, delimiter='\t'):
      if len(row) != 2 or not row[0].strip():
        continue
      try:
        answers = ast.literal_eval(row[1])
      except (ValueError, SyntaxError, MemoryError, RecursionError):
        continue
      if (isinstance(answers, list) and answers
          and all(isinstance(a, str) for a in answers) and _kept(answers)):
        expected.append(open_qa.QAExample(row[0].strip(), _kept(answers)))
  report = SkipReport('fuzz')
  if expected:
    assert open_qa.load('nq_open', 'train', root, report) == expected
  else:
    with pytest.raises(ValueError, match=re.escape(path)):
      open_qa.load('nq_open', 'train', root, report)


@fuzz(150)
@given(rows=st.lists(_trec_row(), max_size=8))
def test_curated_trec_tsv(fuzz_root, rows):
  CASES['curated_trec_tsv'] += 1
  root = _fresh(fuzz_root)
  os.mkdir(os.path.join(root, 'curated_trec'))
  path = os.path.join(root, 'curated_trec', 'large2180-test.tsv')
  _write_rows(path, rows)
  _check_load(root, 'curated_trec', 'test', path, rows)


@fuzz(150)
@given(rows=st.lists(_jsonl_qa_row(regex=True), max_size=8))
def test_regex_answers_jsonl(fuzz_root, rows):
  CASES['regex_answers_jsonl'] += 1
  path = os.path.join(_fresh(fuzz_root), 'trec.jsonl')
  _write_rows(path, rows)
  _check_load_file(path, rows, regex=True)


@fuzz(60)
@given(answers=st.lists(st.sampled_from(['Paris', 'a\\ b', 'x|y']),
                        min_size=1, max_size=2),
       invalid=st.lists(INVALID_REGEX, min_size=1, max_size=2),
       swap=st.booleans())
def test_invalid_patterns_beside_valid_ones_are_dropped_and_counted(
    fuzz_root, answers, invalid, swap):
  CASES['mixed_patterns'] += 1
  path = os.path.join(_fresh(fuzz_root), 'mixed.jsonl')
  mixed = invalid + answers if swap else answers + invalid
  with open(path, 'w', encoding='utf-8') as f:
    f.write(json.dumps({'question': 'q', 'answer': mixed}) + '\n')
  report = EveryLocation()
  assert open_qa.load_file(path, regex=True, report=report) == [
      open_qa.QAExample('q', tuple(answers))]
  assert report.as_dict() == {'invalid answer regex': 1}
  assert report.locations == [f'{path}:1']


@fuzz(100)
@given(rows=st.lists(st.one_of(
    st.tuples(SOME_TEXT, _good_answers(SOME_TEXT)).map(
        lambda t: ('good', {'qText': t[0], 'answers': t[1]})),
    st.one_of(st.none(), st.integers(), TEXT, st.lists(TEXT, max_size=2),
              st.tuples(NO_QUESTION, _good_answers(SOME_TEXT)).map(
                  lambda t: {'qText': t[0], 'answers': t[1]}),
              st.tuples(SOME_TEXT, NO_ANSWERS).map(
                  lambda t: {'qText': t[0], 'answers': t[1]})).map(
                      lambda r: ('bad', r))), max_size=6))
def test_web_questions_json(fuzz_root, rows):
  CASES['web_questions_json'] += 1
  root = _fresh(fuzz_root)
  os.mkdir(os.path.join(root, 'web_questions'))
  path = os.path.join(root, 'web_questions', 'test.json')
  with open(path, 'w', encoding='utf-8') as f:
    json.dump([row for _, row in rows], f)
  good = [open_qa.QAExample(r['qText'].strip(), _kept(r['answers']))
          for kind, r in rows if kind == 'good']
  report = EveryLocation()
  if good:
    assert open_qa.load('web_questions', 'test', root, report) == good
  else:
    with pytest.raises(ValueError, match=re.escape(path)):
      open_qa.load('web_questions', 'test', root, report)
  assert report.locations == [f'{path}[{i}]' for i, (kind, _) in
                              enumerate(rows) if kind == 'bad']


# Whole files of anything: bytes, text, lines of each format mixed.
ANY_FILE = st.one_of(
    st.binary(max_size=200),
    TEXT.map(str.encode),
    st.lists(st.one_of(LINE_TEXT.map(str.encode), NOT_UTF8, BLANK_LINE,
                       JSON_TOO_DEEP.map(str.encode)),
             max_size=6).map(b'\n'.join))


@fuzz(200)
@given(content=ANY_FILE, name=st.sampled_from(
    ['any.tsv', 'any.jsonl', 'any.txt', 'noextension', 'ANY.TSV']),
       regex=st.booleans())
def test_any_qa_file_loads_or_is_refused_by_name(fuzz_root, content, name,
                                                 regex):
  CASES['any_qa_file'] += 1
  path = os.path.join(_fresh(fuzz_root), name)
  with open(path, 'wb') as f:
    f.write(content)
  try:
    examples = open_qa.load_file(path, regex=regex, report=SkipReport('fuzz'))
  except ValueError as error:
    assert path in str(error)
  else:
    assert examples and all(e.question and e.answers for e in examples)


@pytest.mark.parametrize('benchmark,split,name', [
    ('nq_open', 'train', 'topics.nq.dev.txt'),
    ('nq_open', 'test', 'NQ-open.dev.jsonl'),
    ('curated_trec', 'test', 'large2180-test.tsv'),
    ('web_questions', 'test', 'test.json')])
def test_a_qa_directory_or_missing_file_is_refused_by_name(
    tmp_path, benchmark, split, name):
  folder = tmp_path / name.split('.')[0]
  with pytest.raises(FileNotFoundError, match=re.escape(str(folder))):
    open_qa.load_file(str(folder))
  folder.mkdir()
  with pytest.raises(FileNotFoundError, match=re.escape(f'{folder} (a dir')):
    open_qa.load_file(str(folder))
  path = tmp_path / benchmark / name
  path.parent.mkdir()
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    open_qa.load(benchmark, split, tmp_path)
  path.mkdir()
  with pytest.raises(FileNotFoundError,
                     match=re.escape(f'{path} (a directory)')):
    open_qa.load(benchmark, split, tmp_path)


# --- The corpus JSONL ------------------------------------------------------


def _article_row():
  good = st.tuples(TEXT, TEXT, st.dictionaries(
      st.sampled_from(['url', 'id']), TEXT, max_size=1), st.booleans()).map(
          lambda t: ('good', json.dumps({'title': t[0], 'text': t[1], **t[2]},
                                        ensure_ascii=t[3]).encode(),
                     sources.Article(t[0].strip(), t[1])))
  not_text = st.one_of(st.none(), st.integers(), st.lists(TEXT, max_size=2),
                       st.dictionaries(TEXT, TEXT, max_size=1))
  bad = st.one_of(
      NOT_UTF8,
      st.one_of(JSON_CUT, JSON_NOT_OBJECT, JSON_TOO_DEEP, st.integers(
          4_301, 6_000).map(lambda n: '{"title": "t", "text": "x", "n": '
                            + '9' * n + '}')).map(str.encode),
      st.tuples(not_text, TEXT).map(
          lambda t: json.dumps({'title': t[0], 'text': t[1]}).encode()),
      st.tuples(TEXT, not_text).map(
          lambda t: json.dumps({'title': t[0], 'text': t[1]}).encode()),
      TEXT.map(lambda t: json.dumps({'title': t}).encode()),
      TEXT.map(lambda t: json.dumps({'text': t}).encode()),
      LONE_SURROGATE.map(lambda s: json.dumps(
          {'title': s, 'text': 'x'}).encode()),
      LONE_SURROGATE.map(lambda s: json.dumps(
          {'title': 't', 'text': s}).encode()),
  )
  return st.one_of(good, bad.map(lambda b: ('bad', b)),
                   BLANK_LINE.map(lambda b: ('blank', b)))


@fuzz(200)
@given(files=st.lists(st.lists(_article_row(), max_size=6), min_size=1,
                      max_size=3))
def test_corpus_jsonl(fuzz_root, files):
  CASES['corpus_jsonl'] += 1
  root = _fresh(fuzz_root)
  paths, expected, bad, refused = [], [], [], None
  for i, rows in enumerate(files):
    path = os.path.join(root, f'articles-{i}.jsonl')
    _write_rows(path, rows)
    paths.append(path)
    if refused is None:
      expected += [(f'{path}:{n}', row[2]) for n, row in enumerate(rows, 1)
                   if row[0] == 'good']
      bad += _expected(path, rows)[1]
      if not any(row[0] == 'good' for row in rows):
        refused = path
  report = EveryLocation()
  read = []
  if refused is None:
    read.extend(corpus.read_jsonl_articles(paths, report))
  else:
    with pytest.raises(ValueError) as error:
      read.extend(corpus.read_jsonl_articles(paths, report))
    assert str(error.value).startswith(f'{refused}: no ')
  assert read == expected
  assert report.locations == bad


@fuzz(100)
@given(content=ANY_FILE)
def test_any_corpus_file_reads_or_is_refused_by_name(fuzz_root, content):
  CASES['any_corpus_file'] += 1
  path = os.path.join(_fresh(fuzz_root), 'any.jsonl')
  with open(path, 'wb') as f:
    f.write(content)
  try:
    articles = list(corpus.read_jsonl_articles([path], SkipReport('fuzz')))
  except ValueError as error:
    assert str(error).startswith(f'{path}: ')
  else:
    assert articles and all(where.startswith(f'{path}:')
                            for where, _ in articles)


def test_a_corpus_directory_or_missing_file_is_refused_by_name(tmp_path):
  path = tmp_path / 'articles.jsonl'
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    list(corpus.read_jsonl_articles([str(path)], SkipReport('fuzz')))
  path.mkdir()
  with pytest.raises(FileNotFoundError,
                     match=re.escape(f'{path}: it is a directory')):
    list(corpus.read_jsonl_articles([str(path)], SkipReport('fuzz')))


@fuzz(8)
@given(rows=st.lists(_article_row(), min_size=1, max_size=5))
def test_a_corpus_builds_from_any_rows(fuzz_root, tokenizer, rows):
  """The articles read go through the builder (sentences, wordpieces,
  records) whatever their text."""
  CASES['corpus_build'] += 1
  root = _fresh(fuzz_root)
  path = os.path.join(root, 'articles.jsonl')
  _write_rows(path, rows)
  try:
    metadata = corpus.build_corpus(os.path.join(root, 'corpus'), tokenizer,
                                   jsonl_paths=[path], max_block_length=80,
                                   max_title_length=16)
  except ValueError as error:
    assert not any(row[0] == 'good' for row in rows)
    assert str(error).startswith(f'{path}: ')
  else:
    assert metadata['num_articles'] == sum(row[0] == 'good' for row in rows)


# --- gin bindings on the command line ---------------------------------------

# Bindings the default gin file (MiniLM's) takes, and the value each reads.
VALID_BINDING = st.one_of(
    st.integers(1, 64).map(lambda n: (f'BertConfig.num_layers={n}',
                                      'BertConfig.num_layers', n)),
    st.integers(0, 10**9).map(lambda n: (f'train.num_steps={n}',
                                         'train.num_steps', n)),
    st.floats(allow_nan=False, allow_infinity=False).map(
        lambda x: (f'BertConfig.layer_norm_eps={x!r}',
                   'BertConfig.layer_norm_eps', x)),
    TEXT.map(lambda s: (f'build_realm.retriever_pooling={s!r}',
                        'build_realm.retriever_pooling', s)),
)
# Names and values gin cannot take, and text of anything but line breaks
# (a value of several lines would be several bindings, and random text
# could `import` or `include` something).
ONE_LINE = st.text(st.characters(exclude_characters='\n\r'), max_size=30)
BAD_NAME = st.one_of(
    ONE_LINE.filter(lambda s: '=' not in s),  # The flag's first '=' ends it.
    st.sampled_from(['', 'nope.x', 'BertConfig.nope', '1abc', 'a/b.c',
                     'BertConfig.', '.num_layers', 'BertConfig.num_layers.x',
                     '@BertConfig', '%X']))
BAD_VALUE = st.one_of(
    ONE_LINE,
    st.sampled_from(['', '[', '(1,', '{[]: 1}', '@nope()', '%NOPE',
                     '"unterminated', 'lambda: 1', '1 2', '\x00', '\ud800',
                     '@BertConfig()/x', "b'\\xff", '1\ninclude "nowhere.gin"',
                     '1\nimport no_such_module']),
    DEEP.map(lambda n: '[' * n), DEEP.map(lambda n: '-' * n + '1'),
    DEEP.map(lambda n: '+'.join(['1'] * (n // 10))))


def _gin_command_line(flag: str):
  """The `embed` command's arguments after `--gin.` flags become bindings,
  as `main` reads them."""
  parser = main._parser()
  return parser.parse_args(common.gin_flags(parser, ['embed', flag]))


@fuzz(100)
@given(binding=VALID_BINDING)
def test_valid_gin_bindings_are_taken(binding):
  CASES['gin_valid'] += 1
  flag_binding, name, value = binding
  gin.clear_config()
  try:
    common.parse_gin(_gin_command_line(f'--gin.{flag_binding}'))
    assert gin.query_parameter(name) == value
  finally:
    gin.clear_config()


@fuzz(300)
@given(name=BAD_NAME, value=BAD_VALUE)
def test_bad_gin_bindings_are_refused_by_name(name, value):
  CASES['gin_bad'] += 1
  gin.clear_config()
  try:
    args = _gin_command_line(f'--gin.{name}={value}')
    (binding,) = args.gin_bindings
    assert binding == f'{name} = {value}'
    try:
      common.parse_gin(args)
    except ValueError as error:
      assert repr(binding) in str(error)
  finally:
    gin.clear_config()


@fuzz(30)
@given(name=ONE_LINE.filter(lambda s: '=' not in s))
def test_a_gin_flag_without_a_value_is_a_usage_error(name):
  CASES['gin_no_value'] += 1
  with pytest.raises(SystemExit) as error:
    _gin_command_line(f'--gin.{name}')
  assert error.value.code == 2


# --- The launch TOML --------------------------------------------------------


def _toml_string(text: str) -> str:
  return '"' + ''.join(
      f'\\u{ord(c):04x}' if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7f
      else c for c in text) + '"'


def _toml_value(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, float):
    return ('nan' if value != value else
            'inf' if value == float('inf') else
            '-inf' if value == float('-inf') else repr(value))
  if isinstance(value, int):
    return str(value)
  if isinstance(value, str):
    return _toml_string(value)
  if isinstance(value, list):
    return '[' + ', '.join(map(_toml_value, value)) + ']'
  return '{' + ', '.join(f'{_toml_string(k)} = {_toml_value(v)}'
                         for k, v in value.items()) + '}'


def _toml(table: dict) -> str:
  """A TOML document of `table`: top-level tables as [sections]."""
  lines = [f'{_toml_string(k)} = {_toml_value(v)}' for k, v in table.items()
           if not isinstance(v, dict)]
  for key, section in table.items():
    if isinstance(section, dict):
      lines.append(f'[{_toml_string(key)}]')
      lines += [f'{_toml_string(k)} = {_toml_value(v)}'
                for k, v in section.items()]
  return '\n'.join(lines) + '\n'


KEY = st.text(CHARS, min_size=1, max_size=15)
TOML_VALUE = st.recursive(
    st.one_of(TEXT, st.booleans(), st.integers(-2**63, 2**63 - 1),
              st.floats()),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(KEY, inner, max_size=3)),
    max_leaves=6)
# Values of the kinds the schema asks for, some of them valid.
LIKELY_VALUE = st.one_of(
    TEXT, st.lists(TEXT, max_size=3), st.dictionaries(KEY, TEXT, max_size=2),
    st.sampled_from(['gs://bucket/x', 'spot', 'preemptible', 'standard',
                     'realm-trainer', 'realm-index-builder']))
SECTIONS = ('install', 'env', 'trainer', 'builder')


def _edit(table: dict, data) -> tuple[str, str | None, str, object]:
  """One random change to `table`, in place: (kind, section, key, value)."""
  section = data.draw(st.sampled_from([None, *SECTIONS]))
  where = table if section is None else table.setdefault(section, {})
  if not isinstance(where, dict):
    section, where = None, table
  kind = data.draw(st.sampled_from(['delete', 'set', 'add']))
  if kind != 'add' and where:
    key = data.draw(st.sampled_from(sorted(where)))
  else:
    kind, key = 'add', data.draw(st.one_of(KEY, st.sampled_from(
        ['name', 'flags', 'gin_files', 'provisioning', 'env', 'PATH', '1X'])))
  if kind == 'delete':
    del where[key]
    return kind, section, key, None
  value = data.draw(st.one_of(TOML_VALUE, LIKELY_VALUE))
  where[key] = value
  return kind, section, key, value


def _load_or_error(path: str):
  try:
    return config_lib.load(path), None
  except config_lib.ConfigError as error:
    assert str(error).startswith(f'{path}: ')
    return None, str(error)


@fuzz(300)
@given(data=st.data())
def test_launch_config_edits(fuzz_root, data):
  with open(PAPER, 'rb') as f:
    table = tomllib.load(f)
  edits = [_edit(table, data)
           for _ in range(data.draw(st.integers(1, 3), label='edits'))]
  CASES['launch_edits'] += 1
  path = os.path.join(_fresh(fuzz_root), 'edited.toml')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(_toml(table))
  config, error = _load_or_error(path)
  if error is not None:
    assert any(key in error or (section and section in error)
               for _, section, key, _ in edits), (edits, error)
    return
  # Taken: every value of the edited file, as read (lists as tuples).
  loaded = dataclasses.asdict(config)
  for key, value in table.items():
    if key in ('install', 'trainer', 'builder'):
      for name, item in value.items():
        assert loaded[key][name] == (
            tuple(item) if isinstance(item, list) else item)
    else:
      assert loaded[key] == (tuple(value) if isinstance(value, list)
                             else value)


@fuzz(200)
@given(content=st.one_of(
    st.binary(max_size=200), TEXT.map(str.encode),
    st.lists(st.one_of(
        st.tuples(KEY, TOML_VALUE).map(
            lambda t: f'{_toml_string(t[0])} = {_toml_value(t[1])}'),
        st.sampled_from(['[install]', '[trainer]', '[[builder]]', '[env]',
                         'project = ', '= 1', 'a = "\\ud800"', 'a = 1e999',
                         'a = 0x', 'a.b.c = 1', '[a', 'a = [1', 'a = """']),
        LINE_TEXT, DEEP.map(lambda n: 'a = ' + '[' * n + ']' * n),
        DEEP.map(lambda n: 'a = ' + '{b = ' * (n // 10) + '1' + '}' * (
            n // 10))), max_size=8).map(
                lambda lines: '\n'.join(lines).encode())))
def test_any_launch_file_loads_or_is_refused_by_name(fuzz_root, content):
  CASES['launch_any_file'] += 1
  path = os.path.join(_fresh(fuzz_root), 'any.toml')
  with open(path, 'wb') as f:
    f.write(content)
  _load_or_error(path)


def test_a_launch_directory_or_missing_file_is_refused_by_name(tmp_path):
  path = str(tmp_path / 'pod.toml')
  assert _load_or_error(path)[1] == f'{path}: no such file'
  os.mkdir(path)
  assert _load_or_error(path)[1].startswith(f'{path}: cannot be read')
