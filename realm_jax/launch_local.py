"""Local launcher: the trainer and the index builder as two processes on one
machine, sharing one model_dir (the pod layout, shrunk to one host).

  python -m realm_jax.launch_local --model_dir=runs/pretrain \\
      --gin_file=gin/runs/pretrain.gin --gin_file=gin/setups/cpu_demo.gin \\
      --gin.train.num_steps=100

The gin files and bindings are the trainer's; the builder reads the run
(its config.gin and run.json: the model, corpus, block length and cadence)
and is given its machine settings alone. The builder's log is
model_dir/refresh.log; the trainer prints to this console (or, with
--train_log, to model_dir/train.log); a gs:// model_dir keeps them in
runs/logs under its path. The builder exits by
itself once the trainer has marked training done and the last step is
published; this waits for both. A builder that dies is restarted (a few times,
each exit logged with the tail of its log) while training goes on with the
index it has; a failed trainer, or a builder out of restarts, stops the other
job, and Ctrl-C stops both. Both jobs keep what XLA compiles in realm-jax's
one on-disk compilation cache (REALM_JAX_CACHE, which they inherit): a
restarted builder, a resumed trainer and the next run of the same model
read it instead of compiling again.
"""

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from realm_jax import quiet

TRAIN_LOG, REFRESH_LOG = 'train.log', 'refresh.log'
# Lines of a failed job's log quoted in the error.
TAIL_LINES = 10
# Times a failed index builder is started again before the run fails.
BUILDER_RESTARTS = 3
# JAX's switch for taking most of a GPU's memory at start-up.
PREALLOCATE = 'XLA_PYTHON_CLIENT_PREALLOCATE'


class JobFailed(RuntimeError):
  """A job exited badly or hung; the message points at its log."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One process: its name in messages, its argv, its log file (None:
  this process's console) and what it adds to this process's environment."""
  name: str
  argv: tuple[str, ...]
  log: str | None = None
  env: tuple[tuple[str, str], ...] = ()


def realm_jax_argv(command: str, model_dir: str, args=()) -> tuple[str, ...]:
  """`realm-jax COMMAND --model_dir=DIR ARGS` with this Python, so the jobs
  run in the caller's environment."""
  return (sys.executable, '-m', 'realm_jax.main', command,
          f'--model_dir={model_dir}', *args)


def log_dir(model_dir: str) -> str:
  """Where the logs go: model_dir, or when it is remote (gs://) runs/logs
  and its path (gs://b/demo/realm: runs/logs/b/demo/realm), so that runs
  trained side by side keep logs apart; a process writes to a local file."""
  if '://' not in model_dir:
    return model_dir
  return os.path.join('runs', 'logs', model_dir.split('://', 1)[1].strip('/'))


def jobs(model_dir: str, train_args, refresh_args,
         train_log: bool = False, train_env=(), refresh_env=(),
         label: str = '') -> tuple[Job, Job]:
  """The trainer and the index builder on `model_dir`; each gets its own
  gin files, flags and environment, and `label` before its name."""
  logs = log_dir(model_dir)
  named = lambda name: f'{label} {name}' if label else name
  return (Job(named('trainer'), realm_jax_argv('train', model_dir, train_args),
              os.path.join(logs, TRAIN_LOG) if train_log else None,
              tuple(train_env)),
          Job(named('index builder'), realm_jax_argv('refresh', model_dir,
                                                     refresh_args),
              os.path.join(logs, REFRESH_LOG), tuple(refresh_env)))


def _start(job: Job, files: contextlib.ExitStack) -> subprocess.Popen:
  output = None
  if job.log is not None:
    output = files.enter_context(open(job.log, 'a', encoding='utf-8'))
    output.write(f'$ {shlex.join(job.argv)}\n')
    output.flush()
  # Unbuffered, so the log shows each line as it is printed. Both jobs
  # share one GPU: neither takes JAX's default 75% of its memory up front.
  process = subprocess.Popen(job.argv, stdout=output,
                             stderr=subprocess.STDOUT if output else None,
                             env={PREALLOCATE: 'false', **os.environ,
                                  'PYTHONUNBUFFERED': '1', **dict(job.env)})
  # One write, newline included: stages side by side start jobs from
  # threads of their own, and print's separate newline interleaves.
  print(f'{job.name}: pid {process.pid}, log {job.log or "this console"}\n',
        end='', flush=True)
  return process


def _stop(process: subprocess.Popen, grace_seconds: float = 10) -> None:
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def exit_on_sigterm(signum, frame) -> None:
  """SIGTERM as SystemExit, so that `finally` blocks stop the jobs."""
  del frame
  raise SystemExit(128 + signum)


def _exit_report(job: Job, code: int) -> str:
  """'NAME failed (why); see LOG, which ends:' and the log's last lines."""
  why = (f'killed by signal {-code}' if code < 0 else f'exit code {code}')
  if job.log is None:
    return f'{job.name} failed ({why}); its output is above'
  with open(job.log, encoding='utf-8', errors='replace') as f:
    tail = ''.join(f.readlines()[-TAIL_LINES:])
  return f'{job.name} failed ({why}); see {job.log}, which ends:\n{tail}'


class _Restarted:
  """A job started again each time it fails, up to `restarts` times."""

  def __init__(self, job: Job, files: contextlib.ExitStack, restarts: int):
    self.job, self.files, self.restarts_left = job, files, restarts
    self.restarts = 0
    self.process = _start(job, files)

  def poll(self) -> int | None:
    """None while it runs (restarted if it failed), 0 once it has finished;
    raises JobFailed when it fails with no restart left."""
    code = self.process.poll()
    if not code:
      return code
    if self.restarts == self.restarts_left:
      raise JobFailed(_exit_report(self.job, code))
    self.restarts += 1
    print(f'{_exit_report(self.job, code).rstrip()}\n{self.job.name}: '
          f'restarting it ({self.restarts} of {self.restarts_left})',
          file=sys.stderr, flush=True)
    self.process = _start(self.job, self.files)
    return None


def _check(cancel: threading.Event | None) -> None:
  if cancel is not None and cancel.is_set():
    raise JobFailed('stopped: the run stops (another of its jobs failed, '
                    'or it was interrupted)')


def run_alone(job: Job, cancel: threading.Event | None = None,
              poll_seconds: float = 0.5) -> None:
  """Runs `job` to its end; raises JobFailed when it fails, or, stopping
  it, once `cancel` is set."""
  if job.log is not None:
    os.makedirs(os.path.dirname(job.log), exist_ok=True)
  with contextlib.ExitStack() as files:
    process = _start(job, files)
    try:
      while (code := process.poll()) is None:
        _check(cancel)
        time.sleep(poll_seconds)
    finally:
      _stop(process)
  if code:
    raise JobFailed(_exit_report(job, code))


def run_beside(main: Job, beside: Job, beside_timeout: float,
               poll_seconds: float = 0.5,
               beside_restarts: int = BUILDER_RESTARTS,
               cancel: threading.Event | None = None) -> None:
  """Runs `beside` for as long as `main` runs, then gives it `beside_timeout`
  seconds to exit by itself (the builder publishes the last step first).

  `beside` is restarted when it fails, up to `beside_restarts` times; `main`
  runs on meanwhile. Raises JobFailed when `main` fails, `beside` fails once
  more, or `beside` does not exit in time; both are stopped on the way out,
  Ctrl-C and `kill` (SIGTERM, raised here as SystemExit) included. `beside`
  may finish before `main` does. Setting `cancel` stops both (JobFailed).
  """
  with contextlib.ExitStack() as files:
    if threading.current_thread() is threading.main_thread():
      files.callback(signal.signal, signal.SIGTERM,
                     signal.signal(signal.SIGTERM, exit_on_sigterm))
    helper = primary = None
    try:
      helper = _Restarted(beside, files, beside_restarts)
      primary = _start(main, files)
      while (code := primary.poll()) is None:
        helper.poll()
        _check(cancel)
        time.sleep(poll_seconds)
      if code:
        raise JobFailed(_exit_report(main, code))
      deadline = time.monotonic() + beside_timeout
      while helper.poll() is None:
        if time.monotonic() > deadline:
          raise JobFailed(
              f'{beside.name} did not exit within {beside_timeout:.0f}s of '
              f'{main.name} finishing; see {beside.log or "its output"}')
        _check(cancel)
        time.sleep(min(poll_seconds, 0.1))
    finally:
      for process in (primary, helper and helper.process):
        if process is not None:
          _stop(process)


def run(model_dir: str, train_args, refresh_args, *, train_log: bool = False,
        refresh_timeout: float = 600, train_env=(), refresh_env=(),
        cancel: threading.Event | None = None, label: str = '') -> None:
  """`realm-jax train` and `realm-jax refresh` on `model_dir`, side by side,
  until both are done; `train_args` / `refresh_args` follow --model_dir,
  `train_env` / `refresh_env` (name, value pairs) add to each one's
  environment; `label` goes before their names in messages.

  Raises JobFailed naming the job that failed and its log, or once `cancel`
  is set.
  """
  os.makedirs(log_dir(model_dir), exist_ok=True)
  trainer, builder = jobs(model_dir, train_args, refresh_args, train_log,
                          train_env, refresh_env, label)
  run_beside(trainer, builder, refresh_timeout, cancel=cancel)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m realm_jax.launch_local',
      description=__doc__.split('\n\n')[0],
      allow_abbrev=False,
      epilog='Single gin bindings also as --gin.train.num_steps=10; they go '
      "to the trainer, and the builder reads the run's.")
  parser.add_argument('--model_dir', required=True)
  parser.add_argument('--gin_file', action='append', required=True,
                      help="The trainer's gin files (repeatable).")
  parser.add_argument('--gin_bindings', action='append', default=[],
                      help='e.g. "train.num_steps = 10" (repeatable).')
  parser.add_argument('--refresh_gin_file', action='append', default=None,
                      help='Gin files for the builder, which then reads '
                      'them, not the run\'s config.gin: for a run trained '
                      'before runs recorded their settings (run.json).')
  parser.add_argument('--searcher', choices=('exact', 'scann'),
                      default='exact')
  parser.add_argument('--poll_seconds', type=float, default=2.0,
                      help='How often the builder looks for a new checkpoint.')
  parser.add_argument('--refresh_timeout', type=float, default=600,
                      help='Seconds the builder gets, after training ends, '
                      'to publish the last step and exit.')
  parser.add_argument('--train_log', action='store_true',
                      help=f'The trainer\'s output to model_dir/{TRAIN_LOG} '
                      'instead of this console.')
  parser.add_argument('--verbose', action='store_true',
                      help="Both jobs show the libraries' set-up lines too "
                      '(realm-jax --verbose).')
  return parser


def parse_args(argv=None) -> argparse.Namespace:
  """The flags, plus `train_args` and `refresh_args`: what follows
  --model_dir on each job's command line."""
  parser = _parser()
  args, extra = parser.parse_known_args(argv)
  unknown = [arg for arg in extra if not arg.startswith('--gin.')]
  if unknown:
    parser.error(f'unrecognized arguments: {" ".join(unknown)}')
  args.train_args = [
      *(f'--gin_file={path}' for path in args.gin_file),
      *(f'--gin_bindings={binding}' for binding in args.gin_bindings), *extra]
  # The builder reads the model, corpus, block length and cadence from the
  # run (config.gin, run.json); it is given the machine's settings alone.
  args.refresh_args = [
      *(f'--gin_file={path}' for path in args.refresh_gin_file or ()),
      f'--searcher={args.searcher}', f'--poll_seconds={args.poll_seconds:g}']
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  quiet.quiet(args.verbose)  # The jobs inherit the environment it sets.
  try:
    run(args.model_dir, args.train_args, args.refresh_args,
        train_log=args.train_log, refresh_timeout=args.refresh_timeout)
  except JobFailed as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    return 130
  return 0


if __name__ == '__main__':
  sys.exit(main())
