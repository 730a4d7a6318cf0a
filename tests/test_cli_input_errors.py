"""Bad flags, paths and inputs of the commands that load a model: each is
refused in one message, exit code 2, before the model loads where it can
be; none ends in a traceback or in a success that did nothing."""

import json
import logging
import os
import shutil

import gin
import pytest

from realm_jax import default_files, errors, main, run_directory
from realm_jax.data import corpus, corpus_changes
from realm_jax.export import writer
from realm_jax.index import refresh
from realm_jax.models import pretrained
from realm_jax.models.bert import BertConfig
from realm_jax.released import tensor_files
from tests.helpers import REPO, TINY, run_cli


@pytest.fixture
def aot_environment(monkeypatch):
  """The environment `aot` changes for the devices it fakes, put back."""
  for name in ('XLA_FLAGS', 'JAX_PLATFORMS'):
    if name in os.environ:
      monkeypatch.setenv(name, os.environ[name])
    else:
      monkeypatch.delenv(name, raising=False)


def _refused(argv, capsys, *messages) -> str:
  code, printed = run_cli(argv, capsys)
  assert code == 2, printed
  assert 'Traceback' not in printed
  for message in messages:
    assert message in printed, printed
  return printed


@pytest.mark.unit
@pytest.mark.parametrize('argv, flag', [
    (['eval', '--task=nq_open', '--batch_size=0'], '--batch_size'),
    (['eval', '--task=nq_open', '--batch_size=-2'], '--batch_size'),
    (['eval', '--task=nq_open', '--num_examples=0'], '--num_examples'),
    (['eval', '--task=nq_open', '--num_examples=-1'], '--num_examples'),
    (['embed', '--batch_size=0'], '--batch_size'),
    (['embed', '--batch_size=-5'], '--batch_size'),
    (['aot', '--mesh=0'], '--mesh'),
    (['aot', '--mesh=-2'], '--mesh'),
    (['aot', '--mesh=1', '--builder_mesh=-1'], '--builder_mesh'),
    (['aot', '--mesh=1', '--device_memory_gib=-1'], '--device_memory_gib'),
    (['aot', '--mesh=1', '--device_memory_gib=nan'], '--device_memory_gib'),
    (['refresh', '--batch_size=0'], '--batch_size'),
    (['refresh', '--poll_seconds=-1'], '--poll_seconds'),
], ids=lambda v: ' '.join(v) if isinstance(v, list) else None)
@pytest.mark.usefixtures('aot_environment')
def test_a_count_or_size_of_0_or_less_is_refused_by_its_flag(
    argv, flag, tmp_path, capsys):
  model_dir = tmp_path / 'run'
  _refused([*argv, f'--model_dir={model_dir}'], capsys,
           f'argument {flag}: ', 'above 0')
  assert not model_dir.exists()  # Refused before anything is written.


@pytest.mark.unit
@pytest.mark.parametrize('command', ['search', 'ask', 'fill'])
@pytest.mark.parametrize('output, problem', [
    ('{tmp}/nowhere/o.jsonl', 'there is no directory {tmp}/nowhere'),
    ('{tmp}', 'it is a directory'),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(
    command, output, problem, tmp_path, capsys):
  output = output.format(tmp=tmp_path)
  # The run is missing: only a check made before it loads can answer.
  _refused([command, 'The [MASK] is red.', f'--model_dir={tmp_path}/run',
            f'--output={output}'], capsys,
           f'realm-jax {command}: Cannot write --output {output}: '
           f'{problem.format(tmp=tmp_path)}.')


@pytest.mark.unit
@pytest.mark.parametrize('flag, message', [
    ('--retrieval_output={tmp}/nowhere/r.json',
     'Cannot write --retrieval_output {tmp}/nowhere/r.json: there is no '
     'directory {tmp}/nowhere.'),
    ('--retrieval_output={tmp}', 'it is a directory'),
    ('--output_dir={tmp}/file/x', 'Cannot make --output_dir {tmp}/file/x'),
])
def test_eval_refuses_an_output_it_cannot_write_before_the_model_loads(
    flag, message, tmp_path, capsys):
  (tmp_path / 'file').write_text('a file\n')
  _refused(['eval', '--task=nq_open', f'--model_dir={tmp_path}/run',
            flag.format(tmp=tmp_path)], capsys, message.format(tmp=tmp_path))


@pytest.mark.unit
@pytest.mark.parametrize('argv, flag', [
    (['export', '--model_dir={tmp}/run'], '--output'),
    (['embed', '--model_dir={tmp}/run'], '--output_dir'),
    (['import', '--export={tmp}/export'], '--model_dir'),
    (['data', 'build-corpus', '--jsonl={tmp}/leads.jsonl'], '--output_dir'),
    (['data', 'export', '--gin_file=gin/runs/pretrain.gin'], '--output_dir'),
    (['demo'], '--work_dir'),
], ids=lambda v: ' '.join(v[:2]) if isinstance(v, list) else None)
@pytest.mark.parametrize('where, problem', [
    ('{tmp}/file/out', '{tmp}/file is a file'),
    ('{tmp}/file', 'it is a file'),
])
def test_an_output_directory_that_cannot_be_made_is_refused_first(
    argv, flag, where, problem, tmp_path, capsys):
  """The run, export and leads named are not there: only a check made
  before they are read can answer."""
  (tmp_path / 'file').write_text('a file\n')
  where = where.format(tmp=tmp_path)
  _refused([a.format(tmp=tmp_path) for a in argv] + [f'{flag}={where}'],
           capsys, f'Cannot write {flag} {where}: '
           f'{problem.format(tmp=tmp_path)}.')


@pytest.mark.unit
@pytest.mark.usefixtures('aot_environment')
def test_aot_refuses_an_output_it_cannot_write_before_compiling(tmp_path,
                                                                capsys):
  _refused(['aot', '--mesh=1', '--builder_mesh=1',
            f'--output={tmp_path}/nowhere/aot.json', *TINY,
            "--gin.Pretrain.bert_dir=''",
            '--gin.compile_and_fit.num_blocks=1000',
            '--gin.compile_and_fit.block_length=32',
            '--gin.compile_and_fit.embed_batch_size=64'], capsys,
           f'realm-jax aot: Cannot write --output {tmp_path}/nowhere/aot.json')


@pytest.mark.integration
@pytest.mark.parametrize('lines, problem', [
    (b'', 'it has no text'),
    (b'\n  \n', 'it has no text'),
    (b'\xff\xfe\n', 'every line was skipped'),
])
def test_search_refuses_a_file_that_leaves_nothing_to_search(
    lines, problem, trained_pretraining, small_corpus_env, tmp_path, capsys):
  """Before the model loads: the run gains no index of its step."""
  queries = tmp_path / 'queries.txt'
  queries.write_bytes(lines)
  indexes = sorted(os.listdir(run_directory.index_dir(trained_pretraining)))
  _refused(['search', f'--queries={queries}',
            f'--model_dir={trained_pretraining}'], capsys,
           f'realm-jax search: Nothing to search in {queries}: {problem}.')
  assert sorted(os.listdir(run_directory.index_dir(trained_pretraining))) == (
      indexes)


@pytest.mark.integration
@pytest.mark.slow
def test_fill_refuses_more_masks_than_the_run_fills_and_skips_such_a_line(
    trained_pretraining, small_corpus_env, tmp_path, capsys):
  """The run masks at most 8 spans (tests.helpers.RETRIEVAL). A copy: the
  line it fills publishes the run's index of its step, which the shared
  run must not gain."""
  model_dir = shutil.copytree(trained_pretraining, str(tmp_path / 'run'))
  nine = ' '.join(['[MASK]'] * 9)
  _refused(['fill', nine, f'--model_dir={model_dir}'], capsys,
           f"'{nine}' has 9 [MASK]s; this run fills at most 8 a sentence.")
  texts = tmp_path / 'texts.txt'
  texts.write_text(f'{nine}\nThe [MASK] is red.\n')
  output = tmp_path / 'filled.jsonl'
  code, printed = run_cli(['fill', f'--texts={texts}', f'--output={output}',
                        f'--model_dir={model_dir}'], capsys)
  assert code == 0, printed
  assert f'{texts}:1: ' in printed and 'not fillable: 1' in printed
  rows = [json.loads(line) for line in output.read_text().splitlines()]
  assert [row['text'] for row in rows] == ['The [MASK] is red.']
  texts.write_text(f'{nine}\n')
  _refused(['fill', f'--texts={texts}', f'--model_dir={model_dir}'],
           capsys, f'Nothing to fill in {texts}: every line was skipped.')


@pytest.mark.integration
@pytest.mark.slow
def test_search_never_shows_a_removed_block(trained_pretraining, small_corpus,
                                            tmp_path, capsys, monkeypatch):
  """top_k over every block: the removed one is not among them, nor the
  null document in its place."""
  corpora = tmp_path / 'corpora'
  shutil.copytree(small_corpus, corpora)
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(corpora))
  model_dir = str(tmp_path / 'run')
  shutil.copytree(trained_pretraining, model_dir)
  with open(default_files.wiki_leads_json(), encoding='utf-8') as f:
    title = next(iter(json.load(f)))
  (tmp_path / 'titles.txt').write_text(title + '\n')
  code, printed = run_cli(['corpus', 'remove', f'--model_dir={model_dir}',
                        f'--titles={tmp_path / "titles.txt"}'], capsys)
  assert code == 0, printed
  metadata = corpus.load_metadata(str(corpora / 'wiki_leads'))
  removed = set(corpus_changes.removed_ids(metadata).tolist())
  live = metadata['num_blocks'] - len(removed)
  assert 0 < live < metadata['num_blocks']
  output = tmp_path / 'search.jsonl'
  code, printed = run_cli(['search', 'zebra', f'--model_dir={model_dir}',
                        f'--top_k={metadata["num_blocks"] + 1}',
                        f'--output={output}'], capsys)
  assert code == 0, printed
  blocks = json.loads(output.read_text())['blocks']
  assert len(blocks) == live
  assert all(b['title'] != '(null document)' for b in blocks)
  assert not {b['block_id'] for b in blocks} & removed


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures('aot_environment')
def test_aot_embeds_an_ict_runs_blocks_at_the_runs_block_length(
    tmp_path, capsys):
  """An ICT run whose towers hold 128 positions: the builder's embedding
  step is compiled for its 128-wordpiece blocks, not the corpus's 288."""
  model_dir = tmp_path / 'ict'
  model_dir.mkdir()
  gin.add_config_file_search_path(REPO)
  gin.parse_config_files_and_bindings(
      ['gin/runs/ict.gin', 'gin/models/tiny.gin'],
      [f[len('--gin.'):].replace('=', ' = ', 1) for f in TINY
       if f.startswith('--gin.')] + [
           'BertConfig.max_position_embeddings = 128', 'BLOCK_LENGTH = 128',
           'Ict.query_length = 16', "Ict.bert_dir = ''"])
  (model_dir / 'config.gin').write_text(gin.config_str())
  code, printed = run_cli(['aot', f'--model_dir={model_dir}', '--mesh=1',
                        '--builder_mesh=1'], capsys)
  assert code == 0, printed
  assert '| embed step | 1 | 1024 blocks x 128 |' in printed


@pytest.mark.integration
def test_embed_names_bert_weights_that_are_not_there(small_corpus_env,
                                                     tmp_path, capsys):
  _refused(['embed', f'--bert_dir={tmp_path}/nothing'], capsys,
           f'realm-jax embed: BERT weights not found: {tmp_path}/nothing')
  _refused(['embed', f'--bert_dir={tmp_path}'], capsys,
           f'realm-jax embed: No BERT weights in directory {tmp_path}')


@pytest.mark.unit
def test_missing_weights_and_tensor_files_are_user_errors(tmp_path):
  with pytest.raises(errors.NotFound, match='BERT weights not found'):
    pretrained.load_bert_params(str(tmp_path / 'nothing'),
                                BertConfig(vocab_size=8))
  with pytest.raises(errors.NotFound, match='No tensor file at'):
    tensor_files.open_tensor_file(tmp_path / 'nothing')
  with pytest.raises(errors.NotFound, match='No tensor file in directory'):
    tensor_files.open_tensor_file(tmp_path)


@pytest.mark.unit
def test_import_names_a_source_or_an_export_it_cannot_read(tmp_path, capsys):
  _refused(['import', f'--model_dir={tmp_path}/new', '--source=nosuch',
            '--blocks=nosuch2'], capsys,
           'realm-jax import: No tensor file at nosuch')
  _refused(['import', f'--model_dir={tmp_path}/new',
            f'--export={tmp_path}/nowhere'], capsys,
           f'No export directory {tmp_path}/nowhere.')
  (tmp_path / 'export').mkdir()
  (tmp_path / 'export' / 'manifest.json').write_text('{"format": "rea')
  _refused(['import', f'--model_dir={tmp_path}/new',
            f'--export={tmp_path}/export'], capsys,
           f'{tmp_path}/export/manifest.json is not JSON')
  whole = {'format': writer.FORMAT, 'run': {'kind': 'Pretrain', 'step': 2},
           'corpus': {'name': 'wiki_leads', 'fingerprint': 'f'},
           'index': {}, 'parts': [], 'files': {}}
  for manifest, said in (
      ([1, 2], 'holds an array, not the object'),
      ({**whole, 'files': ['a']}, 'field files is an array; an export writes an object'),
      ({**whole, 'run': {'kind': 'Pretrain'}}, 'field run.step is missing'),
      ({**whole, 'corpus': {**whole['corpus'], 'name': 3}},
       'field corpus.name is a number; an export writes a string'),
      ({**whole, 'files': {'a': 'b'}}, 'an entry that is not an object')):
    (tmp_path / 'export' / 'manifest.json').write_text(json.dumps(manifest))
    _refused(['import', f'--model_dir={tmp_path}/new',
              f'--export={tmp_path}/export'], capsys,
             f'{tmp_path}/export/manifest.json', said)
  assert not (tmp_path / 'new').exists()


@pytest.mark.unit
def test_eval_refused_after_making_its_output_dir_leaves_none(tmp_path,
                                                             capsys):
  """--output_dir is made before the run loads (one that cannot be is
  refused first); a run that then cannot load takes it away again."""
  _refused(['eval', f'--model_dir={tmp_path}/missing', '--task=nq_open',
            f'--output_dir={tmp_path}/made/eval'], capsys,
           f'{tmp_path}/missing is not a realm-jax training run')
  assert not (tmp_path / 'made').exists()
  (tmp_path / 'kept').mkdir()
  _refused(['eval', f'--model_dir={tmp_path}/missing', '--task=nq_open',
            f'--output_dir={tmp_path}/kept/eval'], capsys)
  assert (tmp_path / 'kept').is_dir()
  assert not (tmp_path / 'kept' / 'eval').exists()


@pytest.mark.integration
def test_refresh_refuses_a_file_and_says_what_it_waits_for(
    small_corpus, tmp_path, capsys, caplog, monkeypatch):
  corpus_dir = f'--corpus_dir={small_corpus}/wiki_leads'
  (tmp_path / 'file').write_text('a file\n')
  _refused(['refresh', f'--model_dir={tmp_path}/file'], capsys,
           f'--model_dir {tmp_path}/file is a file')

  class Waited(Exception):
    pass

  def sleep(seconds):
    raise Waited(seconds)

  monkeypatch.setattr(refresh.time, 'sleep', sleep)
  caplog.set_level(logging.INFO, logger=refresh.log.name)
  with pytest.raises(Waited):  # For the trainer's record of the run.
    main.main(['refresh', f'--model_dir={tmp_path}/typo'])
  assert (f'waiting for a trainer to record the run in {tmp_path}/typo'
          in caplog.text)
  gin.clear_config()
  with pytest.raises(Waited):  # Told the corpus: for checkpoints alone.
    main.main(['refresh', f'--model_dir={tmp_path}/typo', corpus_dir])
  assert (f'waiting for a trainer to write checkpoints in {tmp_path}/typo'
          in caplog.text)


@pytest.mark.integration
def test_each_builder_setting_takes_its_gin_binding_or_its_flag_not_both(
    tmp_path, capsys, monkeypatch):
  """A binding of run_refresh's searcher, poll_seconds or batch_size
  reaches the builder (a bad one is refused by it, the poll waits as
  long as bound); a flag beside a binding of the same setting is refused."""
  argv = ['refresh', f'--model_dir={tmp_path}/run']  # Waits for the run.
  gin_ = lambda binding: f'--gin_bindings=run_refresh.{binding}'
  _refused([*argv, gin_("searcher = 'faiss'")], capsys,
           "searcher='faiss'; expected one of")
  _refused([*argv, gin_('batch_size = 0')], capsys, 'batch_size=0 must be')
  _refused([*argv, '--batch_size=8', gin_('batch_size = 16')], capsys,
           '--batch_size=8 and the gin binding run_refresh.batch_size = 16 '
           "both set the builder's batch_size; give one.")

  class Waited(Exception):
    pass

  waits = []

  def sleep(seconds):
    waits.append(seconds)  # gin's re-raise keeps the message, not args.
    raise Waited

  monkeypatch.setattr(refresh.time, 'sleep', sleep)
  for args in ([gin_('poll_seconds = 0.25')], ['--poll_seconds=0.5']):
    gin.clear_config()
    with pytest.raises(Waited):
      main.main([*argv, *args])
  assert waits == [0.25, 0.5]


@pytest.mark.integration
@pytest.mark.slow
def test_embed_refuses_an_index_step_that_is_there_before_embedding(
    small_corpus_env, tmp_path, capsys, monkeypatch):
  from realm_jax.index import publication  # pylint: disable=g-import-not-at-top
  argv = ['embed', f'--output_dir={tmp_path}/index']
  code, printed = run_cli(argv, capsys)
  assert code == 0, printed

  def never(*args, **kwargs):
    raise AssertionError('embedded again')

  monkeypatch.setattr(publication, 'embed_and_publish', never)
  _refused(argv, capsys, f'{tmp_path}/index already holds index step 0')
