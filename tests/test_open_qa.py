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
