"""Multi-host correctness on one machine: disjoint data shards that assemble
the same global batch, and a 2-process `realm-jax train` (jax.distributed
with a local coordinator, CPU collectives) whose losses equal the 1-process
run's."""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import seqio

from realm_jax.input import seqio_source
from tests.helpers import REPO, RETRIEVAL, TINY

pytestmark = [pytest.mark.integration,
              pytest.mark.usefixtures('small_corpus_env')]

TASK = 'ict_wiki_leads'
ICT_SHAPES = {'query_token_ids': (16,), 'block_id': ()}


def _rows(batch):
  return batch['block_id'].tolist()


def test_data_shards_are_disjoint_slices_of_every_global_batch():
  whole = next(seqio_source.SeqioSource().batches(TASK, 'train', ICT_SHAPES, 8, seed=3,
                                      data_shards=2))
  halves = [next(seqio_source.shard_batches(
      TASK, 'train', ICT_SHAPES, 4, 3, True, None,
      seqio.ShardInfo(i, 2)).as_numpy_iterator())
            for i in range(2)]
  assert _rows(whole) == _rows(halves[0]) + _rows(halves[1])
  # Over an epoch the two shards never read the same block.
  epoch = [set(), set()]
  for i in range(2):
    for batch in seqio_source.shard_batches(
        TASK, 'train', ICT_SHAPES, 1, 0, False, 1,
        seqio.ShardInfo(i, 2)).as_numpy_iterator():
      epoch[i].update(_rows(batch))
  assert epoch[0] and epoch[1] and not epoch[0] & epoch[1]


def test_data_shards_must_divide_the_batch_and_cover_the_processes():
  with pytest.raises(ValueError, match='data_shards=3'):
    seqio_source.SeqioSource().batches(TASK, 'train', ICT_SHAPES, 8, data_shards=3)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


RUNS = {'ict': ["--gin.Ict.bert_dir=''", '--gin.Ict.block_length=64'],
        'pretrain': RETRIEVAL}


def _launch(model_dir, run: str, devices: int, processes: int, steps: int,
            timeout: int = 600):
  """`realm-jax train` as `processes` processes of `devices` CPU devices."""
  port = _free_port()
  argv = [sys.executable, '-X', 'faulthandler', '-m', 'realm_jax.main', 'train',
          f'--model_dir={model_dir}', f'--gin_file=gin/runs/{run}.gin', *TINY,
          f'--gin.train.num_steps={steps}', '--gin.train.log_every=1',
          '--gin.train.data_shards=2', *RUNS[run]]
  jobs = []
  for process in range(processes):
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'}
    if processes > 1:
      env.update(JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
                 JAX_NUM_PROCESSES=str(processes),
                 JAX_PROCESS_ID=str(process))
    log = open(f'{model_dir}.{process}.log', 'w')  # pylint: disable=consider-using-with
    jobs.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT), log))
  try:
    codes = [job.wait(timeout=timeout) for job, _ in jobs]
  except subprocess.TimeoutExpired:
    # faulthandler prints every thread's stack on SIGABRT: where it hung.
    for job, _ in jobs:
      job.send_signal(signal.SIGABRT)
    codes = [f'{job.wait()} after hanging for {timeout} s' for job, _ in jobs]
  for _, log in jobs:
    log.close()
  failed = [(log.name, code) for (_, log), code in zip(jobs, codes) if code]
  if failed:
    raise AssertionError('\n'.join(
        f'{name} exited {code}:\n{open(name).read()[-6000:]}'  # pylint: disable=consider-using-with
        for name, code in failed))


def _losses(model_dir):
  with open(os.path.join(model_dir, 'train_metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [row['step'] for row in rows], [row['loss'] for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize('run', ['ict', 'pretrain'])
def test_two_processes_train_like_one(tmp_path, run):
  """Pre-training also embeds the corpus for its first index and retrieves
  on each host for its own rows."""
  one, two = tmp_path / 'one', tmp_path / 'two'
  _launch(one, run, devices=4, processes=1, steps=3)
  _launch(two, run, devices=2, processes=2, steps=3)
  steps_one, losses_one = _losses(one)
  steps_two, losses_two = _losses(two)
  # Process 0 alone writes metrics: one row per step, not two.
  assert steps_one == steps_two == [1, 2, 3]
  np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
  assert losses_one[0] != losses_one[2]  # It trained.
