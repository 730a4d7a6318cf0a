"""The chaos harness: pre-training with the index builder beside it, killed,
damaged and starved over and over, then checked against an undisturbed run.

  python -m benchmarks.chaos [--faults 200] [--work_dir DIR] [--seed 0]
      [--only VARIANT] [--output docs/results/chaos.json]

Both jobs run as `realm-jax train` and `realm-jax refresh` do, on the tiny
model and the first 60 Wikipedia leads, with the index schedule fixed
(`IndexClient.lockstep_interval`): every step's retrieval, and so its loss,
is then the same however the jobs are interrupted. An episode is one run to
its last step; faults come one at a time while it runs:
  kill trainer     SIGKILL at any moment, during an asynchronous save (a
                   checkpoint, or a retriever snapshot: the trainer saves
                   one of each in turn), while the first index is embedded,
                   or while the trainer waits for an index; then restarted;
  kill builder     SIGKILL at any moment, mid-publish, or while it prunes;
  kill both        both at once;
  damage checkpoint / damage index
                   both killed, then the newest step damaged (a file
                   truncated, a commit marker deleted, garbage written into
                   its metadata, or one bit of its items' bytes flipped, at
                   a position drawn uniformly over them) before both
                   restart;
  stop builder     SIGSTOP for seconds, then SIGCONT.
After each episode it checks, and counts per fault: the trainer resumed from
the newest whole checkpoint; each damaged step was refused with its file
named, and never served; the losses of every step equal the undisturbed
run's (rtol 1e-5); each step's metrics row was written exactly once; no
temporary file or directory is left. It prints a table and writes JSON.
"""

import argparse
import collections
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.run import table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERVAL = 5
TINY_FLAGS = ['--gin_file=gin/runs/pretrain.gin', '--gin_file=gin/models/tiny.gin',
         '--gin.BertConfig.hidden_size=32', '--gin.BertConfig.num_heads=4',
         '--gin.BertConfig.intermediate_size=64',
         '--gin.build_realm.projection_size=16',
         '--gin.build_realm.reader_length=64', '--gin.train.batch_size=8',
         '--gin.bert_adamw.warmup_steps=1', '--gin.Pretrain.num_candidates=4',
         '--gin.Pretrain.max_masked=8', '--gin.Pretrain.query_length=32',
         "--gin.Pretrain.bert_dir=''",
         # The builder's steps alternate: a retriever snapshot, a checkpoint.
         f'--gin.train.retriever_every={INTERVAL}',
         f'--gin.train.checkpoint_every={2 * INTERVAL}',
         '--gin.train.log_every=1',
         f'--gin.IndexClient.lockstep_interval={INTERVAL}',
         f'--gin.run_refresh.refresh_interval_steps={INTERVAL}']


def flags(steps: int) -> list[str]:
  """The trainer's gin flags: the tiny model, `steps` steps in lockstep
  (the builder reads them from the run)."""
  return [*TINY_FLAGS, f'--gin.train.num_steps={steps}']


# (kind, variant): the faults, taken in turn in a shuffled order.
FAULTS = [('kill trainer', 'any moment'),
          ('kill trainer', 'checkpoint save'),
          ('kill trainer', 'first index'),
          ('kill trainer', 'waiting for an index'),
          ('kill builder', 'any moment'),
          ('kill builder', 'mid-publish'),
          ('kill builder', 'pruning'),
          ('kill both', 'any moment'),
          ('damage checkpoint', 'truncated file'),
          ('damage checkpoint', 'commit marker deleted'),
          ('damage checkpoint', 'garbage metadata'),
          ('damage checkpoint', 'bit flipped'),
          ('damage index', 'truncated file'),
          ('damage index', 'commit marker deleted'),
          ('damage index', 'garbage metadata'),
          ('damage index', 'bit flipped'),
          ('stop builder', 'seconds stopped')]
TEMPORARY = ('*.orbax-checkpoint-tmp*', 'pruned/*', '.*')
EPISODE_SECONDS = 900  # Without a finished run by then, the episode failed.


class Job:
  """One `realm-jax` process, restartable; each start logs to its own file."""

  def __init__(self, name: str, argv: list[str], log_dir: str, env: dict):
    self.name, self.argv, self.log_dir, self.env = name, argv, log_dir, env
    self.process, self.starts = None, 0

  def start(self) -> None:
    self.starts += 1
    with open(self.log_path(), 'w') as log:
      self.process = subprocess.Popen(
          [sys.executable, '-m', 'realm_jax.main', *self.argv], cwd=REPO,
          env=self.env, stdout=log, stderr=subprocess.STDOUT)

  def log_path(self, start: int | None = None) -> str:
    return os.path.join(self.log_dir,
                        f'{self.name}-{start or self.starts}.log')

  def log(self, start: int | None = None) -> str:
    with open(self.log_path(start), errors='replace') as f:
      return f.read()

  def kill(self) -> None:
    if self.process and self.process.poll() is None:
      self.process.send_signal(signal.SIGKILL)
    if self.process:
      self.process.wait()

  def running(self) -> bool:
    return self.process is not None and self.process.poll() is None


def _steps(directory: str) -> list[int]:
  """The finished steps of a checkpoints or index directory."""
  return sorted(int(name) for name in os.listdir(directory)
                if name.isdigit()) if os.path.isdir(directory) else []


def _rows(model_dir: str) -> list[dict]:
  path = os.path.join(model_dir, 'train_metrics.jsonl')
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass  # A row being written.
  return rows


def _last_row(model_dir: str) -> int:
  return max((row['step'] for row in _rows(model_dir)), default=0)


def _wait(predicate, seconds: float, every: float = 0.002) -> bool:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(every)
  return False


class Episode:
  """One run to its last step with faults injected, and its checks."""

  def __init__(self, number: int, work_dir: str, env: dict,
               rng: random.Random, steps: int, pace: float = 1.0):
    # pace: seconds are scaled by it (the gaps between faults, how long a
    # chosen moment is waited for): below 1 for a short run.
    self.steps, self.pace = steps, pace
    self.model_dir = os.path.join(work_dir, f'episode-{number}')
    self.log_dir = self.model_dir + '-logs'
    for old in (self.model_dir, self.log_dir):  # Of an earlier harness run.
      shutil.rmtree(old, ignore_errors=True)
    os.makedirs(self.log_dir)
    self.rng = rng
    self.checkpoints = os.path.join(self.model_dir, 'checkpoints')
    self.snapshots = os.path.join(self.model_dir, 'retriever_snapshots')
    self.index = os.path.join(self.model_dir, 'index')
    self.trainer = Job('trainer', ['train', f'--model_dir={self.model_dir}',
                                   *flags(steps)], self.log_dir, env)
    # The builder reads the model, corpus and cadence from the run.
    self.builder = Job('builder', [
        'refresh', f'--model_dir={self.model_dir}', '--poll_seconds=0.2',
        '--batch_size=16'], self.log_dir, env)
    self.faults = []  # One record per fault injected.
    self.resume_expectations = []  # (trainer start, the step it must resume)
    self.damaged = []  # (what, step, file, trainer start after, builder's)

  # Where the jobs are, from what they leave on disk.
  def trainer_phase(self) -> str:
    if any(glob.glob(os.path.join(directory, '*.orbax-checkpoint-tmp*'))
           for directory in (self.checkpoints, self.snapshots)):
      return 'checkpoint save'
    if 0 in _steps(self.checkpoints) and not _steps(self.index):
      return 'first index'
    if os.path.exists(os.path.join(self.index, 'REQUESTED')):
      return 'waiting for an index'
    return 'stepping'

  def builder_phase(self) -> str:
    if glob.glob(os.path.join(self.index, '*.orbax-checkpoint-tmp*')):
      return 'mid-publish'
    if glob.glob(os.path.join(self.index, 'pruned', '*')):
      return 'pruning'
    return 'polling or embedding'

  def start(self) -> None:
    self.trainer.start()
    self.builder.start()

  def stepping(self, after_row: int, seconds: float = 300) -> bool:
    """Waits until the trainer writes a row past `after_row` (it is past
    its start-up) or finishes."""
    return _wait(lambda: _last_row(self.model_dir) > after_row or
                 not self.trainer.running(), seconds, every=0.05)

  def newest_whole_checkpoint(self, skip: int | None = None) -> int | None:
    kept = [s for s in _steps(self.checkpoints) if s != skip]
    return kept[-1] if kept else None

  def restart_trainer(self, skip: int | None = None) -> int:
    """Kills and starts the trainer; returns the last metrics row the
    killed one left (read once it is dead: a row it wrote while being
    killed would otherwise pass for the new one stepping)."""
    self.trainer.kill()
    row = _last_row(self.model_dir)
    expected = self.newest_whole_checkpoint(skip)
    self.trainer.start()
    if expected is not None:
      self.resume_expectations.append((self.trainer.starts, expected))
    return row

  def inject(self, kind: str, variant: str) -> dict:
    record = {'kind': kind, 'variant': variant}
    if kind == 'kill trainer':
      target = {'checkpoint save': lambda: self.trainer_phase() ==
                'checkpoint save',
                'first index': lambda: self.trainer_phase() == 'first index',
                'waiting for an index': lambda: self.trainer_phase() ==
                'waiting for an index'}.get(variant)
      if target:
        _wait(target, 30 * self.pace)
      else:
        time.sleep(self.rng.uniform(0, 3 * self.pace))
      record['phase'] = self.trainer_phase()
      self.stepping(self.restart_trainer())
    elif kind == 'kill builder':
      target = {'mid-publish': lambda: self.builder_phase() == 'mid-publish',
                'pruning': lambda: self.builder_phase() == 'pruning'
                }.get(variant)
      if target:
        _wait(target, 30 * self.pace)
      else:
        time.sleep(self.rng.uniform(0, 3 * self.pace))
      record['phase'] = self.builder_phase()
      self.builder.kill()
      self.builder.start()
    elif kind == 'kill both':
      time.sleep(self.rng.uniform(0, 3 * self.pace))
      record['phase'] = f'{self.trainer_phase()} / {self.builder_phase()}'
      self.builder.kill()
      row = self.restart_trainer()
      self.builder.start()
      self.stepping(row)
    elif kind.startswith('damage'):
      record.update(self.damage(kind.split()[1], variant))
    elif kind == 'stop builder':
      record['phase'] = self.builder_phase()
      seconds = self.rng.uniform(3, 10)
      self.builder.process.send_signal(signal.SIGSTOP)
      time.sleep(seconds)
      self.builder.process.send_signal(signal.SIGCONT)
      record['stopped_seconds'] = round(seconds, 1)
    return record

  def damage(self, what: str, variant: str) -> dict:
    """Kills both jobs, damages the newest step of `what`, restarts both."""
    self.trainer.kill()
    self.builder.kill()
    row = _last_row(self.model_dir)  # Once the trainer is dead.
    directory = self.checkpoints if what == 'checkpoint' else self.index
    steps = _steps(directory)
    # The first checkpoint has no earlier one to fall back on.
    if what == 'checkpoint' and len(steps) < 2 or not steps:
      self.restart_trainer()
      self.builder.start()
      self.stepping(row)
      return {'phase': 'nothing to damage yet', 'damaged': None}
    step = steps[-1]
    where = os.path.join(directory, str(step))
    files = sorted((os.path.getsize(p), p) for p in glob.glob(
        os.path.join(where, '**', '*'), recursive=True) if os.path.isfile(p))
    if variant == 'truncated file':
      size, path = files[-1]  # The largest: parameters or embeddings.
      with open(path, 'r+b') as f:
        f.truncate(size // 2)
    elif variant == 'commit marker deleted':
      markers = [p for _, p in files if p.endswith('commit_success.txt')]
      path = self.rng.choice(markers)
      os.remove(path)
    elif variant == 'bit flipped':
      path = self.flip_a_bit(where)
    else:
      names = (['data_position/metadata', '_CHECKPOINT_METADATA']
               if what == 'checkpoint' else ['metadata/metadata'])
      path = os.path.join(where, self.rng.choice(names))
      with open(path, 'wb') as f:
        f.write(bytes(self.rng.randrange(256) for _ in range(64)))
    self.restart_trainer(skip=step if what == 'checkpoint' else None)
    self.builder.start()
    self.damaged.append({'what': what, 'step': step, 'file': path,
                         'trainer_start': self.trainer.starts,
                         'builder_start': self.builder.starts})
    self.stepping(row)
    return {'phase': f'both killed, {variant}', 'damaged': os.path.relpath(
        path, self.model_dir)}

  def flip_a_bit(self, step_dir: str) -> str:
    """Flips one bit of the step's items, drawn uniformly over their bytes
    (Orbax's commit markers and the checksums themselves aside: they are
    written after, or are, what is checked); returns the file."""
    files = [p for p in glob.glob(os.path.join(step_dir, '*', '**', '*'),
                                  recursive=True)
             if os.path.isfile(p) and os.path.basename(p) not in (
                 'commit_success.txt', 'checksums.json')]
    sizes = np.array([os.path.getsize(p) for p in files])
    bit = self.rng.randrange(int(sizes.sum()) * 8)
    index = int(np.searchsorted(np.cumsum(sizes) * 8, bit, side='right'))
    path, offset = files[index], bit - int(sizes[:index].sum()) * 8
    with open(path, 'r+b') as f:
      f.seek(offset // 8)
      byte = f.read(1)[0]
      f.seek(offset // 8)
      f.write(bytes([byte ^ 1 << offset % 8]))
    return path

  def finish(self) -> bool:
    """Lets both jobs end; False if they did not within the time left."""
    finished = _wait(lambda: not self.trainer.running(), EPISODE_SECONDS,
                     every=0.5)
    finished = finished and _wait(lambda: not self.builder.running(), 120,
                                  every=0.5)
    self.trainer.kill()
    self.builder.kill()
    return finished

  def checks(self, reference: dict) -> dict:
    """What went wrong in this episode, by check."""
    rows = collections.Counter(row['step'] for row in _rows(self.model_dir))
    losses = {row['step']: row['loss'] for row in _rows(self.model_dir)}
    missing = [s for s in range(1, self.steps + 1) if rows[s] == 0]
    repeated = [s for s in range(1, self.steps + 1) if rows[s] > 1]
    differing = [s for s in range(1, self.steps + 1) if s in losses and not
                 np.isclose(losses[s], reference[s], rtol=1e-5, atol=0)]
    wrong_resumes = []
    for start, expected in self.resume_expectations:
      found = re.search(r'resumed from step (\d+)', self.trainer.log(start))
      if not found or int(found.group(1)) != expected:
        wrong_resumes.append({'start': start, 'expected': expected,
                              'resumed': found and int(found.group(1))})
    unnamed, served, outcomes = [], [], {}
    for damaged in self.damaged:
      # The logs of the jobs started after the damage, until the next start.
      logs = ''.join(self.trainer.log(s) for s in range(
          damaged['trainer_start'], self.trainer.starts + 1)) + ''.join(
              self.builder.log(s) for s in range(
                  damaged['builder_start'], self.builder.starts + 1))
      # The file, or the item holding it (TensorStore names its database).
      name = os.path.relpath(damaged['file'], self.model_dir)
      item = '/'.join(name.split('/')[:3])
      named = next((n for n in (name, item + ':', item + '/:') if n in logs),
                   None)
      serving = rf'serving index step {damaged["step"]}\b'
      if named:
        outcomes[name] = 'refused'
        if damaged['what'] == 'index' and re.search(
            serving, logs.split(named)[0]):
          served.append(name)
      elif damaged['what'] == 'index' and not re.search(serving, logs):
        outcomes[name] = 'not read'  # Pruned, or not needed before the end.
      else:
        unnamed.append(name)
    left = [os.path.relpath(p, self.model_dir) for pattern in TEMPORARY
            for sub in ('checkpoints', 'retriever_snapshots', 'index', '')
            for p in glob.glob(
                os.path.join(self.model_dir, sub, pattern))]
    return {'trainer_exit': self.trainer.process.returncode,
            'builder_exit': self.builder.process.returncode,
            'done_marker': os.path.exists(
                os.path.join(self.checkpoints, 'TRAINING_DONE')),
            'missing_rows': missing, 'repeated_rows': repeated,
            'differing_losses': differing, 'wrong_resumes': wrong_resumes,
            'damage_not_named': unnamed, 'damage_served': served,
            'damage_outcomes': outcomes,
            'temporary_left': left}


def _passed(checks: dict) -> bool:
  return (checks['trainer_exit'] == 0 and checks['builder_exit'] == 0 and
          checks['done_marker'] and not any(
              checks[k] for k in ('missing_rows', 'repeated_rows',
                                  'differing_losses', 'wrong_resumes',
                                  'damage_not_named', 'damage_served',
                                  'temporary_left')))


def build_corpus(root: str) -> None:
  """The first 60 Wikipedia leads as `wiki_leads`, salient spans marked."""
  # pylint: disable=g-import-not-at-top
  from realm_jax import default_files
  from realm_jax.data import corpus, salient_spans
  from realm_jax.data.tokenization import WordPieceTokenizer
  tokenizer = WordPieceTokenizer(default_files.minilm_vocab())
  with open(default_files.wiki_leads_json(), encoding='utf-8') as f:
    leads = dict(list(json.load(f).items())[:60])
  source = os.path.join(root, 'leads.json')
  with open(source, 'w', encoding='utf-8') as f:
    json.dump(leads, f)
  directory = os.path.join(root, 'wiki_leads')
  corpus.build_corpus(directory, tokenizer, wiki_leads_json=source,
                      blocks_per_shard=25)
  salient_spans.annotate_corpus(directory, tokenizer, num_processes=1,
                                validation_per_mille=200)


def reference_losses(work_dir: str, env: dict, steps: int) -> dict:
  """Step -> loss of the undisturbed run (trainer and builder side by side),
  kept in the work directory for the next harness run of the same flags."""
  kept = os.path.join(work_dir, 'undisturbed.json')
  if os.path.exists(kept):
    with open(kept) as f:
      saved = json.load(f)
    if saved['flags'] == flags(steps):
      return {int(step): loss for step, loss in saved['losses'].items()}
  episode = Episode(0, work_dir, env, random.Random(0), steps)
  episode.start()
  if not episode.finish():
    raise RuntimeError(f'The undisturbed run did not finish: see '
                       f'{episode.log_dir}.')
  checks = episode.checks({s: 0.0 for s in range(1, steps + 1)})
  if checks['trainer_exit'] or checks['missing_rows']:
    raise RuntimeError(f'The undisturbed run failed: see {episode.log_dir}.')
  losses = {row['step']: row['loss'] for row in _rows(episode.model_dir)}
  with open(kept, 'w') as f:
    json.dump({'flags': flags(steps), 'losses': losses}, f)
  shutil.rmtree(episode.model_dir)
  shutil.rmtree(episode.log_dir)
  return losses


def fault_order(count: int, rng: random.Random, only: str | None = None
                ) -> list[tuple[str, str]]:
  """`count` faults: the kinds in turn (so each comes once in the first six),
  each kind's variants in turn, in a random order within each round; with
  `only`, the faults whose variant is it."""
  chosen = [f for f in FAULTS if only in (None, f[1])]
  if not chosen:
    raise ValueError(f'No fault is {only!r}; the variants: '
                     f'{sorted({v for _, v in FAULTS})}.')
  variants = collections.defaultdict(list)
  for kind, variant in chosen:
    variants[kind].append(variant)
  for kind in variants:
    rng.shuffle(variants[kind])
  order, turn = [], 0
  while len(order) < count:
    round_ = [(kind, names[turn % len(names)])
              for kind, names in variants.items()]
    rng.shuffle(round_)
    order += round_
    turn += 1
  return order[:count]


def run(num_faults: int, work_dir: str, seed: int = 0, steps: int = 40,
        pace: float = 1.0, only: str | None = None,
        output: str | None = None, setting: dict | None = None) -> dict:
  """Undisturbed, then `num_faults` faults (of variant `only`, if given)
  over as many `steps`-step episodes as they take; the faults' and the
  episodes' records, also written to `output` after each episode, beside
  `setting` (an hour of faults is not lost to a harness that dies at the
  end). `pace` scales the waits (see `Episode`)."""
  rng = random.Random(seed)
  corpora = os.path.join(work_dir, 'corpora')
  if not os.path.isdir(os.path.join(corpora, 'wiki_leads')):
    os.makedirs(corpora, exist_ok=True)
    build_corpus(corpora)
  # Restarts reuse the compiled steps (JAX's persistent cache): a fault
  # costs the restart, not a compilation.
  env = {**os.environ, 'REALM_CORPUS_DIR': corpora,
         'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_COMPILATION_CACHE_DIR': os.path.join(work_dir, 'jax_cache'),
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
         'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}
  started = time.perf_counter()
  reference = reference_losses(work_dir, env, steps)
  order, records, episodes = fault_order(num_faults, rng, only), [], []
  print(f'undisturbed run: {steps} steps in '
        f'{time.perf_counter() - started:.0f}s; {num_faults} faults to go',
        flush=True)
  while order:
    episode = Episode(len(episodes) + 1, work_dir, env, rng, steps, pace)
    episode.start()
    # A fault that can only happen at a run's start goes first.
    first = next((f for f in order if f[1] == 'first index'), None)
    if first:
      order.remove(first)
      order.insert(0, first)
    while order and episode.trainer.running():
      if order[0][1] != 'first index':
        episode.stepping(0)
        time.sleep(rng.uniform(0.5, 3) * pace)
      if _last_row(episode.model_dir) >= steps - 2:
        break  # Too near the end for another fault to land.
      kind, variant = order.pop(0)
      episode.faults.append(episode.inject(kind, variant))
      print(f'  episode {len(episodes) + 1}, fault {len(records) + len(episode.faults)}: '
            f'{kind} ({variant}) at {episode.faults[-1]["phase"]}',
            flush=True)
      if order and order[0][1] == 'first index':
        break  # Needs a fresh episode.
    finished = episode.finish()
    checks = episode.checks(reference)
    passed = finished and _passed(checks)
    for fault in episode.faults:
      if fault.get('damaged'):
        fault['outcome'] = checks['damage_outcomes'].get(fault['damaged'])
      records.append({**fault, 'episode': len(episodes) + 1,
                      'recovered': passed,
                      'losses_identical': not checks['differing_losses'] and
                      not checks['missing_rows']})
    episodes.append({'episode': len(episodes) + 1, 'faults':
                     len(episode.faults), 'finished': finished,
                     'passed': passed, **checks})
    print(f'episode {len(episodes)}: {len(episode.faults)} faults, '
          f'{"passed" if passed else "FAILED: " + json.dumps(checks)}',
          flush=True)
    if output:
      _write(output, {**(setting or {}), 'faults': records,
                      'episodes': episodes,
                      'seconds': round(time.perf_counter() - started, 1),
                      'complete': not order})
    if passed:
      shutil.rmtree(episode.model_dir)
      shutil.rmtree(episode.log_dir)
  return {'faults': records, 'episodes': episodes,
          'seconds': round(time.perf_counter() - started, 1)}


def _write(path: str, result: dict) -> None:
  """`result` as JSON at `path`, replaced whole."""
  partial = f'{path}.partial'
  with open(partial, 'w') as f:
    json.dump(result, f, indent=1)
  os.replace(partial, path)


def summary(result: dict) -> list[dict]:
  """Per fault kind and phase: injected, recovered, losses identical."""
  groups = collections.defaultdict(list)
  for fault in result['faults']:
    groups[(fault['kind'], fault['phase'])].append(fault)
  rows = [{'fault': kind, 'phase': phase, 'injected': len(faults),
           'recovered': sum(f['recovered'] for f in faults),
           'losses identical': sum(f['losses_identical'] for f in faults)}
          for (kind, phase), faults in sorted(groups.items())]
  lost = sum(len(e['missing_rows']) + len(e['differing_losses']) +
             len(e['repeated_rows']) for e in result['episodes'])
  rows.append({'fault': 'all', 'phase': '', 'injected': len(
      result['faults']), 'recovered': sum(r['recovered'] for r in rows),
               'losses identical': sum(r['losses identical'] for r in rows),
               'steps lost or wrong': lost})
  return rows


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.chaos',
                                   description=__doc__.split('\n\n')[0])
  parser.add_argument('--faults', type=int, default=200)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--only', default=None, metavar='VARIANT',
                      help="Inject only this variant of fault (e.g. 'bit "
                      "flipped': every damage kind's).")
  parser.add_argument('--steps', type=int, default=40,
                      help='Steps of each episode (checkpoints and index '
                      f'steps every {INTERVAL}).')
  parser.add_argument('--work_dir', default=None,
                      help='Where the runs go (default: a new temporary '
                      'directory, removed at the end unless a run failed).')
  parser.add_argument('--output', default=None,
                      help='The JSON written (default: chaos.json in the '
                      'work directory).')
  args = parser.parse_args(argv)
  work_dir = args.work_dir or tempfile.mkdtemp(prefix='realm-chaos-')
  output = args.output or os.path.join(work_dir, 'chaos.json')
  # pylint: disable-next=g-import-not-at-top
  from realm_jax.experiments import machine as machine_lib
  # Measured first: the machine as the faults found it, in every write.
  setting = {'machine': machine_lib.machine(), 'date': str(datetime.date.today()),
             'steps_per_episode': args.steps, 'lockstep_interval': INTERVAL,
             'seed': args.seed, 'only': args.only}
  result = run(args.faults, work_dir, args.seed, args.steps, only=args.only,
               output=output, setting=setting)
  result.update(setting, summary=summary(result))
  print(table(result['summary']))
  _write(output, {**result, 'complete': True})
  print(f'wrote {output}')
  if not args.work_dir and all(e['passed'] for e in result['episodes']):
    shutil.rmtree(work_dir)
  return result


if __name__ == '__main__':
  sys.exit(0 if all(e['passed'] for e in main()['episodes']) else 1)
