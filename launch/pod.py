"""Cloud TPU pod launcher: the trainer on one slice, the index builder on
another, both multi-host JAX programs sharing one gs:// model_dir.

  python -m launch.pod --config=launch/configs/paper_v4.toml all --dry-run

Verbs: up (create the slices, or reuse them), install (a checkout of the repo
and a venv on every worker), start (`realm-jax train` / `realm-jax refresh`
in the background on every worker), logs, stop, down (delete the slices), and
all (up, install, start). --dry-run prints the gcloud commands, one per line
and shell-quoted, instead of running them. Every worker of a slice runs the
same command; JAX finds the pod's other hosts itself.
"""

import argparse
import shlex
import subprocess
import sys

from launch import config as config_lib

# The checkout on every worker, relative to the ssh user's home.
REMOTE_DIR = 'realm-jax'
# The `realm-jax` command each slice runs; it also names the job's log.
COMMANDS = {'trainer': 'train', 'builder': 'refresh'}
VERBS = ('up', 'install', 'start', 'logs', 'stop', 'down', 'all')


class LaunchError(RuntimeError):
  """A command failed or a slice does not match the config."""


def _gcloud_tpu(config, verb: str, name: str, *flags: str) -> list[str]:
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, name,
          f'--zone={config.zone}', f'--project={config.project}', *flags]


def describe_command(config, slice_) -> list[str]:
  """Prints the slice's accelerator type; fails when there is no slice."""
  return _gcloud_tpu(config, 'describe', slice_.name,
                     '--format=value(acceleratorType)')


def create_command(config, slice_) -> list[str]:
  flags = [f'--accelerator-type={slice_.accelerator_type}',
           f'--version={slice_.runtime_version}']
  if slice_.provisioning != 'standard':
    flags.append(f'--{slice_.provisioning}')
  return _gcloud_tpu(config, 'create', slice_.name, *flags)


def delete_command(config, slice_) -> list[str]:
  return _gcloud_tpu(config, 'delete', slice_.name, '--quiet')


def ssh_command(config, slice_, script: str, worker: str = 'all') -> list[str]:
  return _gcloud_tpu(config, 'ssh', slice_.name, f'--worker={worker}',
                     f'--command={script}')


def install_script(config) -> str:
  """Python, a checkout of the configured ref, a venv with jax[tpu] at the
  pinned version and the repo with its TensorFlow extra (editable: the jobs
  read gin/ from it), the
  extra packages, and a local copy of the corpus (it is read from local
  files). Re-running it updates the checkout."""
  install = config.install
  pip = '.venv/bin/pip install -q'
  return ' && '.join([
      # A fresh VM's unattended upgrades may hold the apt lock for a while.
      'sudo apt-get -q -o DPkg::Lock::Timeout=600 update',
      'sudo apt-get -q -o DPkg::Lock::Timeout=600 install -y '
      f'{install.python} {install.python}-venv git',
      f'(test -d {REMOTE_DIR} || git clone -q {shlex.quote(install.repo)} '
      f'{REMOTE_DIR})',
      f'cd {REMOTE_DIR}',
      f'git fetch -q {shlex.quote(install.repo)} {shlex.quote(install.ref)}',
      'git checkout -q --detach FETCH_HEAD',
      f'{install.python} -m venv .venv',
      f'{pip} --upgrade pip',
      # The TensorFlow extra: the pods read the seqio tasks (and ScaNN).
      f"{pip} -e '.[tf]' {shlex.quote(f'jax[tpu]=={install.jax_version}')}",
      *(f'{pip} {shlex.join(shlex.split(extra))}'
        for extra in install.pip_install),
      'mkdir -p runs/corpora',
      f'gcloud storage rsync -r {shlex.quote(config.corpus_dir)} runs/corpora',
  ])


def job_argv(config, role: str) -> list[str]:
  """`realm-jax train|refresh` with the shared model_dir and the role's gin."""
  slice_ = getattr(config, role)
  return ['.venv/bin/realm-jax', COMMANDS[role],
          f'--model_dir={config.model_dir}',
          *(f'--gin_file={path}' for path in slice_.gin_files),
          *(f'--gin_bindings={binding}' for binding in slice_.gin_bindings),
          *slice_.flags]


def _files(role: str) -> tuple[str, str]:
  """The job's log and pid file, relative to REMOTE_DIR."""
  return f'logs/{COMMANDS[role]}.log', f'logs/{COMMANDS[role]}.pid'


def start_script(config, role: str) -> str:
  """The job in the background (it outlives the ssh session), its pid kept
  for `stop`; refuses to start a second copy beside a running one."""
  log, pid = _files(role)
  env = ''.join(f'{name}={shlex.quote(value)} '
                for name, value in config.env.items())
  return '; '.join([
      'set -e', f'cd {REMOTE_DIR}', 'mkdir -p logs',
      f'if [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then '
      f'echo "realm-jax {COMMANDS[role]} is already running" >&2; exit 1; fi',
      f'{env}nohup {shlex.join(job_argv(config, role))} > {log} 2>&1 '
      f'< /dev/null & echo $! > {pid}'])


def stop_script(role: str) -> str:
  _, pid = _files(role)
  return (f'cd {REMOTE_DIR} && if [ -f {pid} ]; then kill "$(cat {pid})" '
          f'2>/dev/null || true; rm -f {pid}; fi')


def logs_script(role: str) -> str:
  log, _ = _files(role)
  return f'tail -n 100 -f {REMOTE_DIR}/{log}'


def commands(config, verb: str, job: str = 'trainer',
             worker: str = '0') -> list[list[str]]:
  """Every command of `verb`, in order. For up, each slice's describe and
  create: a real run creates only the slices that describe does not find."""
  slices = config.slices()
  if verb == 'up':
    return [command for _, slice_ in slices for command in (
        describe_command(config, slice_), create_command(config, slice_))]
  if verb == 'install':
    script = install_script(config)
    return [ssh_command(config, slice_, script) for _, slice_ in slices]
  if verb == 'start':
    return [ssh_command(config, slice_, start_script(config, role))
            for role, slice_ in slices]
  if verb == 'logs':
    return [ssh_command(config, getattr(config, job), logs_script(job),
                        worker)]
  if verb == 'stop':
    return [ssh_command(config, slice_, stop_script(role))
            for role, slice_ in slices]
  if verb == 'down':
    return [delete_command(config, slice_) for _, slice_ in slices]
  if verb == 'all':
    return [command for step in ('up', 'install', 'start')
            for command in commands(config, step)]
  raise ValueError(f'unknown verb {verb!r}; expected one of {VERBS}')


def _run(argv: list[str], capture: bool = False) -> subprocess.CompletedProcess:
  print(f'+ {shlex.join(argv)}', flush=True)
  try:
    return subprocess.run(argv, capture_output=capture, text=True,
                          check=False)
  except FileNotFoundError:
    raise LaunchError(f'{argv[0]} not found on PATH (install the Google '
                      'Cloud SDK and run `gcloud auth login`)') from None


def _checked(argv: list[str]) -> None:
  code = _run(argv).returncode
  if code != 0:
    raise LaunchError(f'exit code {code} from: {shlex.join(argv)}')


def _up(config) -> None:
  """Creates each slice that describe does not find; reuses one that has the
  configured accelerator type."""
  for _, slice_ in config.slices():
    found = _run(describe_command(config, slice_), capture=True)
    if found.returncode != 0:
      _checked(create_command(config, slice_))
      continue
    existing = found.stdout.strip().rsplit('/', 1)[-1]
    if existing != slice_.accelerator_type:
      raise LaunchError(
          f'slice {slice_.name} exists as {existing!r}, the config asks for '
          f'{slice_.accelerator_type!r}: delete it (down) or rename the slice')
    print(f'{slice_.name}: exists ({existing}), reused', flush=True)


def execute(config, verb: str, job: str = 'trainer', worker: str = '0') -> None:
  """Runs `verb`'s commands, stopping at the first failure."""
  for step in ('up', 'install', 'start') if verb == 'all' else (verb,):
    if step == 'up':
      _up(config)
    else:
      for argv in commands(config, step, job, worker):
        _checked(argv)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m launch.pod', description=__doc__.split('\n\n')[0])
  parser.add_argument('--config', required=True, help='A TOML file, e.g. '
                      'launch/configs/paper_v4.toml.')
  parser.add_argument('verb', choices=VERBS)
  parser.add_argument('--dry-run', action='store_true',
                      help='Print the commands instead of running them.')
  parser.add_argument('--job', choices=tuple(COMMANDS), default='trainer',
                      help='logs: whose log to follow.')
  parser.add_argument('--worker', default='0',
                      help='logs: which worker of the slice.')
  return parser


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  try:
    config = config_lib.load(args.config)
    if args.dry_run:
      for command in commands(config, args.verb, args.job, args.worker):
        print(shlex.join(command))
      return 0
    unedited = config_lib.placeholders(config)
    if unedited:
      raise config_lib.ConfigError(
          f'{args.config}: still has {config_lib.PLACEHOLDER}... placeholders '
          f'in {", ".join(unedited)}; edit them first (--dry-run works '
          'without)')
    execute(config, args.verb, args.job, args.worker)
  except (config_lib.ConfigError, LaunchError) as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # Leaving `logs` with Ctrl-C.
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
