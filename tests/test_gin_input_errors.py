"""Bad gin and bad run directories given to the commands: each is refused in
a line that names the file, the binding or the run at fault, with exit code
2 and no traceback; none is silently ignored."""

import json
import os

from etils.epath import gpath
import pytest

from realm_jax import errors, run_directory, run_guard
from realm_jax.experiments import preset as preset_lib
from realm_jax.training import optimizer, run_loader
from tests.helpers import run_cli

TRAIN = ['train', '--gin_file=gin/runs/ict.gin',
         '--gin_file=gin/models/tiny.gin']
# What gin's parser and Python's tokenizer and decoder cannot take.
BAD_GIN_TEXT = {
    'open bracket': (b'x = (\n', 'the text ends inside a bracket'),
    'binary': (bytes(range(128, 256)) * 2, 'not UTF-8 text'),
}


def _refused(code, printed, command, *said):
  """A user error of `command`: exit code 2, its line saying `said`."""
  assert code == 2, printed
  assert 'Traceback' not in printed, printed
  assert f'realm-jax {command}: ' in printed, printed
  for text in said:
    assert text in printed, printed


def _run_dir(tmp_path, config: str | bytes, run_format=None) -> str:
  """A run directory holding `config` as its config.gin and, if given,
  `run_format` (an object, or text) as its run_format.json."""
  model_dir = tmp_path / 'run'
  model_dir.mkdir()
  config_path = model_dir / run_directory.CONFIG
  (config_path.write_bytes if isinstance(config, bytes)
   else config_path.write_text)(config)
  if run_format is not None:
    (model_dir / run_directory.FORMAT_FILE).write_text(
        run_format if isinstance(run_format, str) else json.dumps(run_format))
  return str(model_dir)


ICT_CONFIG = "include 'gin/runs/ict.gin'\ninclude 'gin/models/tiny.gin'\n"


# 1. The user's gin, layered over a run's config.gin.


@pytest.mark.integration
def test_a_typo_in_gin_layered_over_a_trained_run_is_refused(
    trained_pretraining, tmp_path, capsys):
  """A run's own config.gin is read tolerantly; the user's files and
  bindings are checked as `train` checks them."""
  typo = tmp_path / 'typo.gin'
  typo.write_text('Pretrian.num_candidates = 3\n')
  with pytest.raises(errors.BadConfig, match='Pretrian') as refused:
    run_loader.load_run(trained_pretraining, [str(typo)])
  assert str(typo) in str(refused.value)
  code, printed = run_cli(['embed', f'--model_dir={trained_pretraining}',
                        f'--output={tmp_path / "index"}',
                        '--gin.foo.bar=3'], capsys)
  _refused(code, printed, 'embed', "gin binding 'foo.bar = 3'",
           "No configurable matching 'foo'")
  assert '--gin_file' not in printed  # No hint about files for a binding.
  assert not (tmp_path / 'index').exists()


@pytest.mark.unit
@pytest.mark.parametrize('binding,said', [
    ('Pretrain.num_candidatez = 3', "doesn't have a parameter named"),
    ('X = [1,', 'ends inside a bracket or a string'),
    ('Ict.query_length = zz', "Failed to parse token 'zz'")])
def test_a_bad_binding_over_a_run_is_named(tmp_path, binding, said):
  with pytest.raises(errors.BadConfig) as refused:
    run_loader.load_run(_run_dir(tmp_path, ICT_CONFIG), (), [binding])
  message = str(refused.value)
  assert message.startswith(f'gin binding {binding!r}: ') and said in message
  assert 'Check the --gin_file paths' not in message


# 2. A gin file gin cannot parse.


@pytest.mark.unit
@pytest.mark.parametrize('text,said', BAD_GIN_TEXT.values(),
                         ids=BAD_GIN_TEXT.keys())
def test_a_gin_file_gin_cannot_parse_is_named(tmp_path, capsys, text, said):
  bad = tmp_path / 'bad.gin'
  bad.write_bytes(text)
  code, printed = run_cli([*TRAIN, f'--model_dir={tmp_path / "t"}',
                        f'--gin_file={bad}'], capsys)
  _refused(code, printed, 'train', f'gin file {bad}: {said}')
  with pytest.raises(errors.BadConfig, match=f'gin file {bad}: {said}'):
    run_loader.load_run(_run_dir(tmp_path, ICT_CONFIG), [str(bad)])


@pytest.mark.unit
def test_a_binding_gin_cannot_tokenize_is_named(tmp_path, capsys):
  code, printed = run_cli([*TRAIN, f'--model_dir={tmp_path / "t"}',
                        '--gin.X=[1,'], capsys)
  _refused(code, printed, 'train',
           "gin binding 'X = [1,': the text ends inside a bracket")


# 3. A run whose own config.gin is damaged.


@pytest.mark.unit
@pytest.mark.parametrize('config', [
    bytes(range(128, 256)) * 4,
    ICT_CONFIG + 'BertConfig.hidden_size = (',
    ICT_CONFIG + 'BertConfig.hidden'], ids=['binary', 'cut', 'cut_name'])
def test_a_damaged_config_gin_is_named(tmp_path, capsys, config):
  model_dir = _run_dir(tmp_path, config)
  code, printed = run_cli(['search', 'x', f'--model_dir={model_dir}'], capsys)
  _refused(code, printed, 'search',
           f'{model_dir}/{run_directory.CONFIG} is damaged: ')


@pytest.mark.unit
def test_a_config_gin_that_cannot_be_read_is_not_called_damaged(
    tmp_path, capsys, monkeypatch):
  """Denied by its permissions (faked: the tests run as root, whom none
  stop), it is said as such, in a line, as any file denied to a command."""
  model_dir = _run_dir(tmp_path, ICT_CONFIG)
  config = f'{model_dir}/{run_directory.CONFIG}'
  read_bytes = gpath.PosixGPath.read_bytes

  def denied(path):
    if str(path) == config:
      raise PermissionError(13, 'Permission denied', config)
    return read_bytes(path)
  monkeypatch.setattr(gpath.PosixGPath, 'read_bytes', denied)
  code, printed = run_cli(['search', 'x', f'--model_dir={model_dir}'], capsys)
  _refused(code, printed, 'search', f'Permission denied: {config}.')
  assert 'damaged' not in printed


# 5. A run of another layout, or whose format file is garbage.


@pytest.mark.unit
@pytest.mark.parametrize('run_format,said', [
    ({**run_guard.current_format(), 'format': 99}, 'format 99 there'),
    ({**run_guard.current_format(), 'checkpoint_items': ['params']},
     "checkpoint items ['params'] there"),
    ('{"format": 2,', 'is unreadable'),
    ('[2]', 'is unreadable')])
def test_a_run_of_another_layout_is_not_read(tmp_path, capsys, run_format,
                                             said):
  model_dir = _run_dir(tmp_path, ICT_CONFIG, run_format)
  written = (tmp_path / 'run' / run_directory.FORMAT_FILE).read_text()
  for command in (['search', 'x'], ['eval', '--task=nq_open']):
    code, printed = run_cli([*command, f'--model_dir={model_dir}'], capsys)
    _refused(code, printed, command[0], run_directory.FORMAT_FILE, said)
  assert (tmp_path / 'run' / run_directory.FORMAT_FILE).read_text() == written


@pytest.mark.unit
@pytest.mark.parametrize('version', [run_directory.UNROLLED_LAYERS_FORMAT,
                                     run_guard.RUN_FORMAT])
def test_the_readable_formats_pass_the_readers_check(tmp_path, version):
  """Format 1's layers are stacked as they are read; the check writes
  nothing, not even into a run without a format file."""
  model_dir = _run_dir(tmp_path, ICT_CONFIG,
                       {**run_guard.current_format(), 'format': version})
  run_guard.check_readable(model_dir)
  os.remove(os.path.join(model_dir, run_directory.FORMAT_FILE))
  run_guard.check_readable(model_dir)
  assert not os.path.exists(os.path.join(model_dir, run_directory.FORMAT_FILE))


# 6. The warm-up and the step count, each named for what is wrong.


@pytest.mark.unit
@pytest.mark.parametrize('warmup,total,said', [
    (0, -1, 'train.num_steps=-1: give 0 or more steps'),
    (-3, 10, 'bert_adamw.warmup_steps=-3: give 0 or more warm-up steps')])
def test_a_bad_schedule_names_what_is_wrong(warmup, total, said):
  with pytest.raises(errors.BadConfig) as refused:
    optimizer.bert_schedule(1e-4, warmup, total)
  assert said in str(refused.value) and 'fewer' not in str(refused.value)


@pytest.mark.unit
@pytest.mark.parametrize('bindings,said', [
    (["retriever_signal.name = 'realm'"],
     "retriever_signal.name='realm'; expected one of 'marginal', 'emdr2', "
     "'pdist'"),
    (["retriever_signal.name = 'pdist'", 'retriever_signal.temperature = 0'],
     'retriever_signal.temperature=0; expected > 0'),
    (["retriever_signal.name = 'emdr2'",
      'Finetune.retriever_beam_size = 20'],
     'Finetune.retriever_beam_size=20 scores blocks it does not read')])
def test_a_retriever_signal_that_cannot_train_is_named(tmp_path, capsys,
                                                       bindings, said):
  run = 'finetune' if 'beam' in bindings[-1] else 'pretrain'
  code, printed = run_cli(
      ['train', f'--gin_file=gin/runs/{run}.gin',
       '--gin_file=gin/models/tiny.gin', f'--model_dir={tmp_path / "t"}',
       *(f'--gin_bindings={b}' for b in bindings)], capsys)
  _refused(code, printed, 'train', said)


# 7. An undefined macro, named without the whole config.


@pytest.mark.unit
def test_an_undefined_macro_is_named_briefly(tmp_path, capsys):
  macro_gin = tmp_path / 'macro.gin'
  macro_gin.write_text('Ict.query_length = %NOPE\n')
  for flags, said in (
      (['--gin.train.num_steps=%UNDEF'],
       "%UNDEF is not defined (used by 'train.num_steps = %UNDEF')"),
      ([f'--gin_file={macro_gin}'],
       '%NOPE is not defined (used by Ict.query_length = %NOPE)')):
    code, printed = run_cli([*TRAIN, f'--model_dir={tmp_path / "t"}', *flags],
                         capsys)
    _refused(code, printed, 'train', said)
    assert 'Parameters for' not in printed and len(printed) < 300, printed


@pytest.mark.unit
def test_an_undefined_macro_over_a_run_is_named_before_use():
  # Over a run the config stays unlocked; gin would fail only at the use.
  run_loader.parse_gin([], ['LENGTH = 5', 'Ict.query_length = %LENGTH',
                            "Finetune.qa_regex = '%d %s'"], finalize=False)
  with pytest.raises(errors.BadConfig, match=(
      r"gin binding 'Ict.query_length = %NOPE': %NOPE is not defined")):
    run_loader.parse_gin([], ['Ict.query_length = %NOPE'], finalize=False)


# 8. --gin.X given to a command that takes no gin.


@pytest.mark.unit
def test_a_gin_flag_to_a_command_without_gin_is_refused_as_typed(capsys):
  code, printed = run_cli(['search', 'x', '--model_dir=y', '--gin.foo=1'],
                       capsys)
  assert code == 2
  assert 'unrecognized arguments: --gin.foo=1' in printed
  assert '--gin_bindings' not in printed


# 9. Preset files.


@pytest.mark.unit
def test_a_preset_file_that_is_not_python_is_named_by_line(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text('from realm_jax.experiments.preset import Preset\n'
                 'PRESET = Preset(\n')
  with pytest.raises(errors.BadInput, match=f'^{bad}:2: '):
    preset_lib.load(str(bad))


@pytest.mark.unit
def test_a_preset_file_that_is_not_there_is_said_to_be_missing(tmp_path):
  with pytest.raises(errors.NotFound, match='No preset file .*nope.py'):
    preset_lib.load(str(tmp_path / 'nope.py'))


@pytest.mark.unit
def test_a_preset_of_an_unknown_family_lists_the_known_ones(tmp_path, capsys):
  odd = tmp_path / 'odd.py'
  odd.write_text('from realm_jax.experiments.preset import Preset\n'
                 "PRESET = Preset(family='bogus', setup='x.gin', sizes={},\n"
                 '                stages=())\n')
  code, printed = run_cli(['demo', f'--preset={odd}',
                        f'--work_dir={tmp_path / "work"}'], capsys)
  _refused(code, printed, 'demo', str(odd), "family='bogus'", "'demo'",
           "'world'")
  assert 'not \'demo\'' not in printed
  assert not (tmp_path / 'work').exists()
