"""Bad input to the data commands (`data build-corpus`, `data annotate`,
`data world`, `corpus add`) and the readers under them: refused in one
message that names the file, line or flag, before anything changes, or
counted by what is wrong with it."""

import json
import logging
import os
import shutil

import pytest

from realm_jax import errors
from realm_jax.data import corpus, corpus_changes, open_qa, world
from realm_jax.data.skips import SkipReport
from realm_jax.data.tokenization import WordPieceTokenizer
from tests.helpers import run_cli

ARTICLES = [{'title': 'Zebra', 'text': 'The zebra is a striped horse of '
                                       'Africa. It lives in herds.'},
            {'title': 'Quokka', 'text': 'The quokka is a small wallaby.'}]


def _jsonl(path, lines) -> str:
  path.write_bytes(b''.join((line if isinstance(line, bytes) else
                             json.dumps(line).encode()) + b'\n'
                            for line in lines))
  return str(path)


@pytest.fixture
def articles(tmp_path) -> str:
  return _jsonl(tmp_path / 'articles.jsonl', ARTICLES)


@pytest.fixture
def garbage(tmp_path) -> str:
  path = tmp_path / 'garbage.bin'
  path.write_bytes(bytes(range(128, 256)) * 8)
  return str(path)


@pytest.mark.integration
def test_build_corpus_refuses_to_replace_a_file(tmp_path, articles, capsys):
  target = tmp_path / 'precious.txt'
  target.write_text('keep me\n')
  code, printed = run_cli(['data', 'build-corpus', f'--output_dir={target}',
                        f'--jsonl={articles}'], capsys)
  assert code == 2, printed
  assert f'--output_dir {target}: it is a file' in printed
  assert 'Traceback' not in printed
  assert target.read_text() == 'keep me\n'


@pytest.mark.integration
def test_build_corpus_builds_over_a_corpus_or_an_empty_folder_alone(
    tmp_path, articles, capsys):
  empty = tmp_path / 'empty'
  empty.mkdir()
  for _ in range(2):  # Into the empty folder, then over the corpus built.
    code, printed = run_cli(['data', 'build-corpus', f'--output_dir={empty}',
                          f'--jsonl={articles}'], capsys)
    assert code == 0, printed
    assert corpus.load_metadata(str(empty))['num_articles'] == 2
  others = tmp_path / 'others'
  others.mkdir()
  (others / 'notes.txt').write_text('not a corpus\n')
  code, printed = run_cli(['data', 'build-corpus', f'--output_dir={others}',
                        f'--jsonl={articles}'], capsys)
  assert code == 2, printed
  assert f'{others} holds files but no corpus' in printed
  assert sorted(p.name for p in others.iterdir()) == ['notes.txt']


@pytest.mark.unit
def test_corpus_add_refuses_a_batch_size_under_1_before_loading_anything(
    tmp_path, articles, capsys, monkeypatch):
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top

  def never(*args, **kwargs):
    raise AssertionError('the run was loaded')

  monkeypatch.setattr(run_loader, 'load_run', never)
  code, printed = run_cli(['corpus', 'add', f'--model_dir={tmp_path}',
                        f'--jsonl={articles}', '--batch_size=0'], capsys)
  assert code == 2, printed
  assert "argument --batch_size: '0': give a whole number above 0" in printed


@pytest.mark.integration
def test_corpus_add_reports_the_lines_it_skipped(tmp_path, articles, tokenizer,
                                                 caplog):
  directory = str(tmp_path / 'corpus')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[articles])
  extra = _jsonl(tmp_path / 'extra.jsonl', [
      {'title': 'Okapi', 'text': 'The okapi is a forest giraffe.'},
      b'{"title": "Broken", ',
      {'title': 5, 'text': 'A number for a title.'}])
  with caplog.at_level(logging.INFO, logger='realm_jax'):
    corpus_changes.add_articles(directory, tokenizer, [extra])
  assert 'corpus add: 2 skipped or repaired' in caplog.text
  assert f'invalid JSON: 1 (e.g. {extra}:2)' in caplog.text
  assert f'title not a string: 1 (e.g. {extra}:3)' in caplog.text


@pytest.mark.unit
def test_articles_of_the_wrong_type_are_counted_as_that(tmp_path):
  path = _jsonl(tmp_path / 'articles.jsonl', [
      {'title': 'Good', 'text': 'Kept.'},
      {'title': 5, 'text': 'A number for a title.'},
      {'title': 'List', 'text': ['a', 'list']},
      {'title': 'No text'},
      {'title': None, 'text': 'Null title.'}])
  report = SkipReport('test')
  assert [a.title for _, a in corpus.read_jsonl_articles([path], report)] == [
      'Good']
  assert report.as_dict() == {'missing title or text field': 2,
                              'text not a string': 1, 'title not a string': 1}


@pytest.mark.unit
def test_questions_and_answers_of_the_wrong_type_are_counted_as_that(
    tmp_path):
  path = _jsonl(tmp_path / 'qa.jsonl', [
      {'question': 'kept?', 'answer': ['yes']},
      {'question': 5, 'answer': ['five']},
      {'question': 'numbers?', 'answer': [3]},
      {'question': 'one string?', 'answer': 'Paris'},
      {'question': 'mixed?', 'answer': ['Paris', 3]},
      {'question': 'none?', 'answer': []}])
  report = SkipReport('test')
  assert open_qa.load_file(path, report=report) == [
      open_qa.QAExample('kept?', ('yes',)),
      open_qa.QAExample('mixed?', ('Paris',))]
  # The mixed row keeps its string, as a blank answer beside one would.
  assert report.as_dict() == {
      'answer not a string': 1, 'answers not a list': 1,
      'empty answer list': 1, 'question not a string': 1}
  assert f'question not a string: 1 (e.g. {path}:2)' in report.summary()


@pytest.mark.unit
def test_a_vocab_that_is_not_text_is_refused_naming_it(garbage):
  with pytest.raises(errors.BadInput, match=f'{garbage} is not UTF-8 text'):
    WordPieceTokenizer(garbage)


@pytest.mark.unit
@pytest.mark.parametrize('step', ['build-corpus', 'annotate'])
def test_the_data_commands_refuse_a_vocab_that_is_not_text(
    step, tmp_path, articles, garbage, capsys):
  where = ([f'--output_dir={tmp_path}/out', f'--jsonl={articles}']
           if step == 'build-corpus' else [f'--corpus_dir={tmp_path}/c'])
  code, printed = run_cli(['data', step, *where, f'--vocab={garbage}'], capsys)
  assert code == 2, printed
  assert f'{garbage} is not UTF-8 text' in printed
  assert 'Traceback' not in printed


@pytest.mark.unit
@pytest.mark.parametrize('argv', [
    ['annotate', '--num_processes=0'], ['annotate', '--num_processes=-2'],
    ['build-corpus', '--blocks_per_shard=0']])
def test_the_data_commands_refuse_a_count_under_1(argv, tmp_path, articles,
                                                  capsys):
  where = ([f'--output_dir={tmp_path}/out', f'--jsonl={articles}']
           if argv[0] == 'build-corpus' else [f'--corpus_dir={tmp_path}/c'])
  code, printed = run_cli(['data', *argv, *where], capsys)
  assert code == 2, printed
  flag, value = argv[1].split('=')
  assert f"argument {flag}: '{value}': give a whole number above 0" in printed
  assert not (tmp_path / 'out').exists()


@pytest.mark.integration
def test_annotate_refuses_a_vocab_the_corpus_was_not_built_with(
    tmp_path, articles, tokenizer, capsys):
  directory = str(tmp_path / 'corpus')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[articles])
  other = tmp_path / 'other_vocab.txt'
  shutil.copy(tokenizer.vocab_path, other)
  with open(other, 'a', encoding='utf-8') as f:
    f.write('zebraish\n')
  code, printed = run_cli(['data', 'annotate', f'--corpus_dir={directory}',
                        f'--vocab={other}', '--num_processes=1'], capsys)
  assert code == 2, printed
  assert f'{directory} was built with another vocabulary than {other}' in (
      printed)
  assert not os.path.exists(os.path.join(directory, 'annotated'))


@pytest.mark.unit
@pytest.mark.parametrize('share', [float('nan'), float('inf'),
                                   float('-inf')])
def test_a_world_refuses_a_share_that_is_no_number(share):
  with pytest.raises(errors.BadConfig, match=f'held_out_share={share}'):
    world.WorldSpec(held_out_share=share).check()


@pytest.mark.unit
def test_data_world_refuses_a_nan_share_in_one_line(tmp_path, capsys,
                                                    monkeypatch):
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(tmp_path / 'corpora'))
  code, printed = run_cli(['data', 'world', '--held_out_share', 'nan'], capsys)
  assert code == 2, printed
  assert 'held_out_share=nan: expected strictly between 0 and 1' in printed
  assert not (tmp_path / 'corpora').exists()
