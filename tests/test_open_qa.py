"""The Open-QA benchmarks load with the row counts of shared/data's README."""

import pytest

from realm_jax.data import open_qa
from realm_jax.data.skips import SkipReport
from tests.helpers import DATA_DIR, needs_data


@pytest.mark.integration
@needs_data
@pytest.mark.parametrize('benchmark,split,rows', [
    ('nq_open', 'train', 8_757), ('nq_open', 'test', 3_610),
    ('web_questions', 'train', 3_778), ('web_questions', 'test', 2_032),
    ('curated_trec', 'train', 1_479), ('curated_trec', 'test', 694),
])
def test_row_counts(benchmark, split, rows):
  report = SkipReport('test')
  examples = open_qa.load(benchmark, split, DATA_DIR, report)
  assert len(examples) == rows, report.summary()
  assert all(e.question and e.answers for e in examples)


@pytest.mark.integration
@needs_data
def test_a_pattern_with_a_tab_stays_whole():
  examples = open_qa.load('curated_trec', 'train', DATA_DIR)
  curies = [e for e in examples if e.question == 'What is measured in curies?']
  assert len(curies) == 1 and '\t' in curies[0].answers[0]


@pytest.mark.unit
def test_bad_rows_are_counted_not_raised(tmp_path):
  (tmp_path / 'nq_open').mkdir()
  (tmp_path / 'nq_open' / 'NQ-open.dev.jsonl').write_bytes(
      b'{"question": "q1", "answer": ["a"]}\n'
      b'{"question": "q2", "answer": []}\n'
      b'{"question": "", "answer": ["a"]}\n'
      b'not json\n'
      b'{"question": "q\xff", "answer": ["a"]}\n')
  (tmp_path / 'curated_trec').mkdir()
  (tmp_path / 'curated_trec' / 'large2180-test.tsv').write_text(
      '1\tfactoid\tq1\t(unclosed\n2\tfactoid\tq2\tok|fine\n3\tbroken\n')
  report = SkipReport('test')
  assert open_qa.load('nq_open', 'test', tmp_path, report) == [
      open_qa.QAExample('q1', ('a',))]
  assert open_qa.load('curated_trec', 'test', tmp_path, report) == [
      open_qa.QAExample('q2', ('ok|fine',))]
  assert report.as_dict() == {
      'empty answer list': 1, 'invalid JSON': 1, 'missing question': 1,
      'not UTF-8': 1, 'invalid answer regex': 1, 'malformed TSV row': 1}
  assert 'NQ-open.dev.jsonl:2' in report.summary()


@pytest.mark.unit
def test_missing_directory_says_what_to_set(monkeypatch):
  monkeypatch.delenv(open_qa.DATA_DIR_ENV, raising=False)
  with pytest.raises(FileNotFoundError, match=open_qa.DATA_DIR_ENV):
    open_qa.load('nq_open', 'test')


def _write(path, rows: str, raw: bytes = b''):
  path.write_bytes(rows.encode('utf-8') + raw)
  return str(path)


TOPICS = ("who wrote hamlet?\t['Shakespeare', 'William Shakespeare']\n"
          "what is the capital of france?\t['Paris']\n")
NQ_JSONL = ('{"question": "who wrote hamlet?", "answer": ["Shakespeare", '
            '"William Shakespeare"]}\n'
            '{"question": "what is the capital of france?", "answer": '
            '["Paris"]}\n')
EXPECTED = [
    open_qa.QAExample('who wrote hamlet?',
                      ('Shakespeare', 'William Shakespeare')),
    open_qa.QAExample('what is the capital of france?', ('Paris',))]


@pytest.mark.unit
@pytest.mark.parametrize('name,rows,found', [
    ('topics.txt', TOPICS, 'tsv'), ('any.tsv', TOPICS, 'tsv'),
    ('nq.jsonl', NQ_JSONL, 'jsonl'),
    ('nq.txt', NQ_JSONL, 'jsonl'),  # The first row decides, not the name.
    ('mislabelled.tsv', NQ_JSONL, 'jsonl'),
])
def test_a_qa_file_reads_in_either_format(tmp_path, name, rows, found):
  path = _write(tmp_path / name, rows)
  assert open_qa.qa_file_format(path) == found
  report = SkipReport('test')
  assert open_qa.load_file(path, report=report) == EXPECTED
  assert not report


@pytest.mark.unit
def test_a_header_row_is_counted_when_the_extension_names_the_format(
    tmp_path):
  path = _write(tmp_path / 'with_header.tsv', 'question\tanswers\n' + TOPICS)
  report = SkipReport('test')
  assert open_qa.load_file(path, report=report) == EXPECTED
  assert report.as_dict() == {'malformed TSV row': 1}
  assert 'with_header.tsv:1' in report.summary()


@pytest.mark.unit
@pytest.mark.parametrize('name,rows,match', [
    ('questions.txt', 'question\tanswers\n' + TOPICS,
     r'questions\.txt:1: not an Open-QA row'),
    ('blank_first.csv', '\n\nwho wrote hamlet?,Shakespeare\n',
     r'blank_first\.csv:3: not an Open-QA row'),
    ('empty.jsonl', '\n', r'empty\.jsonl: no question'),
    ('corpus.jsonl', '{"title": "Hamlet", "text": "A play."}\n',
     r'(?s)corpus\.jsonl: no usable question, read as jsonl.*'
     r'missing question: 1'),
])
def test_a_file_of_no_known_format_is_refused_naming_the_line(
    tmp_path, name, rows, match):
  with pytest.raises(ValueError, match=match):
    open_qa.load_file(_write(tmp_path / name, rows))


@pytest.mark.unit
def test_a_missing_qa_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='nowhere.tsv'):
    open_qa.load_file(str(tmp_path / 'nowhere.tsv'))


@pytest.mark.unit
def test_bad_rows_of_a_qa_file_are_counted_with_their_line(tmp_path):
  tsv = _write(tmp_path / 'topics.tsv',
               TOPICS + "no tab here\nq\t['a']\textra\nq\t{[]: 1}\n"
               "q\t[]\n\t['a']\n", b"q\xff\t['a']\n")
  jsonl = _write(tmp_path / 'nq.jsonl',
                 NQ_JSONL + 'not json\n[1, 2]\n{"question": "q"}\n'
                 '{"question": "q", "answer": [""]}\n')
  report = SkipReport('test')
  assert open_qa.load_file(tsv, report=report) == EXPECTED
  assert open_qa.load_file(jsonl, report=report) == EXPECTED
  assert report.as_dict() == {
      'malformed TSV row': 3, 'empty answer list': 3, 'missing question': 1,
      'not UTF-8': 1, 'invalid JSON': 1, 'not a JSON object': 1}
  summary = report.summary()
  assert 'topics.tsv:3' in summary and 'topics.tsv:8' in summary
  assert 'nq.jsonl:3' in summary


@pytest.mark.unit
def test_regex_answers_are_patterns_and_invalid_ones_are_counted(tmp_path):
  path = _write(tmp_path / 'trec.jsonl',
                '{"question": "q1", "answer": ["Shakespeare|Marlowe"]}\n'
                '{"question": "q2", "answer": ["(unclosed", "Paris"]}\n'
                '{"question": "q3", "answer": ["[a-"]}\n')
  report = SkipReport('test')
  assert open_qa.load_file(path, regex=True, report=report) == [
      open_qa.QAExample('q1', ('Shakespeare|Marlowe',)),
      open_qa.QAExample('q2', ('Paris',))]
  assert report.as_dict() == {'invalid answer regex': 2}
  # As strings the same answers are all kept.
  assert len(open_qa.load_file(path)) == 3


@pytest.mark.unit
def test_a_file_holds_out_a_fixed_share_of_its_questions(tmp_path):
  questions = [f'question number {i}?' for i in range(2000)]
  rows = ''.join(f"{q}\t['a']\n" for q in questions)
  forward = _write(tmp_path / 'forward.tsv', rows)
  backward = _write(tmp_path / 'backward.tsv',
                    ''.join(reversed(rows.splitlines(keepends=True))))
  split = {name: {e.question for e in open_qa.load_file(forward, split=name)}
           for name in open_qa.QA_FILE_SPLITS}
  assert split['test'] == set(questions)
  assert split['train'] | split['validation'] == split['test']
  assert not split['train'] & split['validation']
  assert 60 <= len(split['validation']) <= 140  # 5% of 2,000, by hash.
  assert {e.question for e in open_qa.load_file(
      backward, split='validation')} == split['validation']
  with pytest.raises(ValueError, match="Unknown split 'dev'"):
    open_qa.load_file(forward, split='dev')
  one = _write(tmp_path / 'one.tsv', f"{questions[0]}\t['a']\n")
  assert open_qa.load_file(one, split='test')
  empty = 'train' if open_qa.held_out(questions[0]) else 'validation'
  with pytest.raises(ValueError, match=f'none of its 1 questions falls in '
                     f'its {empty} split'):
    open_qa.load_file(one, split=empty)
