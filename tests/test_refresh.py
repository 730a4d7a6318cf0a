"""The trainer/index-builder hand-over, with the real `realm-jax refresh` process."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import gin
import jax
import numpy as np
import pytest
from etils import epath

from realm_jax.data import corpus, example_arrays, open_qa
from realm_jax import default_files, errors, run_directory
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index import publication
from realm_jax.index.client import IndexClient
from realm_jax.models.retriever import init_retriever_params
from realm_jax.index.corpus_sync import _document_tower
from realm_jax.index.refresh import IndexBuilder, due_step
from realm_jax.training.checkpoints import Checkpoints
from realm_jax.training.train_state import TrainState
from realm_jax.evaluation import qa_evaluation
from tests.helpers import (RETRIEVAL, TINY, BuilderStandIn, TrainerStandIn,
                           flip_a_bit, largest_file, run_cli, tiny_retriever,
                           train_tiny, zebra_data)

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_GIN = os.path.join(ROOT, 'gin', 'models', 'tiny.gin')
# Pauses the builder's second publish after it wrote the index metadata, so
# the test can kill it mid-publish.
PAUSE_SECOND_PUBLISH = '''
import sys, time
import orbax.checkpoint as ocp
from realm_jax import main
calls, write = [], ocp.JsonCheckpointHandler.async_save
async def paused(self, directory, *args, **kwargs):
  result = await write(self, directory, *args, **kwargs)
  calls.append(directory)
  if len(calls) == 2:
    time.sleep(600)
  return result
ocp.JsonCheckpointHandler.async_save = paused
sys.exit(main.main(sys.argv[1:]))
'''


def _builder(model_dir, corpus_dir, code=None):
  args = ['refresh', '--model_dir', model_dir, '--corpus_dir', corpus_dir,
          '--gin_file', TINY_GIN, '--poll_seconds', '0.2', '--batch_size',
          '16']
  command = ([sys.executable, '-c', code] if code else
             [sys.executable, '-m', 'realm_jax.main']) + args
  return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def dirs(small_corpus, tmp_path):
  return str(tmp_path / 'model'), os.path.join(small_corpus, 'wiki_leads')


# A builder slower than the trainer: each embedding takes an extra second.
SLOW_BUILDER = '''
import sys, time
from realm_jax import main
from realm_jax.index import publication
embed = publication.embed_corpus
def slow(*args, **kwargs):
  time.sleep(1.0)
  return embed(*args, **kwargs)
publication.embed_corpus = slow
sys.exit(main.main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_the_trainer_swaps_in_each_index_at_its_next_step(dirs):
  """The builder embeds every checkpoint it finds (interval 1) but takes far
  longer than a step; the trainer still serves each new index from the
  first step that starts after its publication."""
  model_dir, corpus_dir = dirs
  trainer = TrainerStandIn(model_dir, corpus_dir)
  trainer.save(0)
  builder = _builder(model_dir, corpus_dir, SLOW_BUILDER)
  published = []  # (trainer step, time) of each 'published index step' line.

  def read_log():
    for line in builder.stdout:
      if line.startswith('published index step'):
        published.append((int(line.split()[3].rstrip(':')), time.time()))
  reader = threading.Thread(target=read_log, daemon=True)
  reader.start()
  looks = []  # (time the look started, index step served after it).
  deadline = time.time() + 240
  # Until a look has started after the fourth publication.
  while len(published) < 4 or looks[-1][0] <= published[3][1]:
    assert time.time() < deadline and builder.poll() is None
    trainer.step += 1
    trainer.save(trainer.step)
    started = time.time()
    trainer.client.maybe_refresh()
    looks.append((started, trainer.client.index_step))
  run_directory.mark_training_done(model_dir)
  assert builder.wait(timeout=120) == 0
  reader.join(timeout=10)
  gaps = np.diff([step for step, _ in published[:4]])
  assert np.all(gaps > 1), published  # Slower than the interval of 1.
  for step, at in published[:4]:
    served = [index for started, index in looks if started > at]
    assert served and served[0] >= step, (step, looks)


@pytest.mark.slow
def test_a_builder_killed_mid_publish_leaves_the_previous_index(dirs):
  model_dir, corpus_dir = dirs
  trainer = TrainerStandIn(model_dir, corpus_dir)
  builder = _builder(model_dir, corpus_dir, PAUSE_SECOND_PUBLISH)
  trainer.save(1)
  trainer.wait_for_index(1, builder)
  trainer.save(2)
  deadline = time.time() + 120
  index = run_directory.index_dir(model_dir)
  while not glob.glob(os.path.join(index, '2.*tmp*')):
    assert time.time() < deadline and builder.poll() is None
    time.sleep(0.05)
  builder.send_signal(signal.SIGKILL)
  builder.wait()

  trainer.step += 1
  assert not trainer.client.maybe_refresh()  # 2 is not visible.
  assert trainer.client.index_step == 1
  queries = np.ones((1, 128), np.float32)
  assert trainer.client.search(queries, 2)[1].shape == (1, 2)

  builder = _builder(model_dir, corpus_dir)  # The next refresh succeeds.
  trainer.wait_for_index(2, builder)
  run_directory.mark_training_done(model_dir)
  assert builder.wait(timeout=120) == 0


def _publish(model_dir, step, embeddings, metadata):
  manager = publication.index_manager(run_directory.index_dir(model_dir))
  publication.publish(manager, step, embeddings, metadata)


def test_client_refuses_an_index_of_another_corpus(dirs):
  model_dir, corpus_dir = dirs
  meta = corpus.load_metadata(corpus_dir)
  embeddings = np.zeros((meta['num_blocks'], 128), np.float32)
  good = publication.index_metadata(meta, embeddings, 1, 'exact')
  for i, (bad, message) in enumerate((
      ({'corpus_fingerprint': 'f' * 64}, 'corpus fingerprint'),
      ({'num_blocks': 7}, 'blocks'),
      ({'dim': 64}, 'embedding dim 64 != 128'),
      ({'block_length': 64}, 'blocks cut to 64 wordpieces != 288'))):
    _publish(f'{model_dir}{i}', 1, embeddings, {**good, **bad})
    client = IndexClient(f'{model_dir}{i}', meta, dim=128)
    with pytest.raises(errors.IndexMismatchError, match=message):
      client.maybe_refresh()
    assert client.searcher is None


def test_the_builder_embeds_a_checkpoint_once_it_is_due():
  assert due_step([], None, 5) is None
  assert due_step([0], None, 5) == 0  # The first index, at once.
  assert due_step([0, 3], 0, 5) is None
  assert due_step([0, 3, 5, 7], 0, 5) == 7  # The newest, not the first due.
  assert due_step([5, 7], 7, 5) is None
  assert due_step([7, 9], 7, 5, training_done=True) == 9  # The final step.
  assert due_step([7], 7, 5, training_done=True) is None


def _served_staleness(model_dir, corpus_dir, stale_factor):
  """Staleness per step of a trainer stand-in that checkpoints every 4
  steps for 120 steps, with the builder (cadence 4 x stale_factor) polled
  after every step; and the steps the builder embedded."""
  trainer = TrainerStandIn(model_dir, corpus_dir)
  trainer.save(0)
  builder = IndexBuilder(model_dir, OpenCorpus(corpus_dir),
                         interval=4 * stale_factor)
  builder.poll()
  staleness = []
  for step in range(1, 121):
    if step % 4 == 0:
      trainer.save(step)
    builder.poll()
    trainer.client.maybe_refresh()
    staleness.append(trainer.client.staleness(step))
  published = run_directory.reload(builder.index)
  return np.mean(staleness), published


@pytest.fixture
def tiny_gin():
  """The in-process builder's towers: gin/models/tiny.gin, as
  TrainerStandIn's."""
  import gin  # pylint: disable=g-import-not-at-top
  gin.parse_config_file(TINY_GIN)


def test_a_step_the_trainer_published_first_is_left_as_it_is(
    dirs, tiny_gin, monkeypatch):
  """A run's first index: the trainer publishes it while the builder embeds
  the same checkpoint; the builder keeps the trainer's and goes on."""
  model_dir, corpus_dir = dirs
  trainer = TrainerStandIn(model_dir, corpus_dir)
  trainer.save(0)
  builder = IndexBuilder(model_dir, OpenCorpus(corpus_dir))
  first = BuilderStandIn(model_dir, corpus_dir)
  embed_and_publish = publication.embed_and_publish

  def trainer_first(*args, **kwargs):
    first.publish()  # Step 0, every embedding 0.
    return embed_and_publish(*args, **kwargs)
  monkeypatch.setattr(publication, 'embed_and_publish', trainer_first)
  assert builder.poll() == 'waiting'
  assert builder.last == 0 and builder.published == 0
  monkeypatch.setattr(publication, 'embed_and_publish', embed_and_publish)
  np.testing.assert_array_equal(
      publication.read_embeddings(builder.index, 0), 0)
  trainer.save(1)
  assert builder.poll() == 'published' and builder.last == 1


@pytest.mark.slow
def test_a_30x_stale_builder_serves_indexes_30x_staler(dirs, tmp_path,
                                                       tiny_gin):
  """The paper's stale-MIPS ablation is the builder's cadence: the trainer
  still swaps in every index at once, and now serves each for 30x longer."""
  model_dir, corpus_dir = dirs
  fresh, fresh_steps = _served_staleness(model_dir, corpus_dir, 1)
  stale, stale_steps = _served_staleness(str(tmp_path / 'stale'), corpus_dir,
                                         30)
  assert fresh_steps == [112, 116, 120]  # Every 4 steps (3 kept).
  assert stale_steps == [0, 120]  # Every 120.
  # Each index is served from the step it was published at for 4 (or 120)
  # steps: on average (4 - 1) / 2 (or (120 - 1) / 2) steps old.
  assert fresh == pytest.approx(1.5) and stale == pytest.approx(59.5)


def test_scann_indexes_are_published_and_loaded(dirs):
  model_dir, corpus_dir = dirs
  meta = corpus.load_metadata(corpus_dir)
  embeddings = np.random.default_rng(1).standard_normal(
      (meta['num_blocks'], 128)).astype(np.float32)
  manager = publication.index_manager(run_directory.index_dir(model_dir))
  from realm_jax.index.scann_searcher import build_scann  # pylint: disable=g-import-not-at-top
  publication.publish(manager, 3, embeddings, publication.index_metadata(
      meta, embeddings, 3, 'scann'), build_scann(embeddings))
  client = IndexClient(model_dir, meta, dim=128, searcher='scann')
  assert client.maybe_refresh()
  _, ids = client.search(embeddings[:2] * 5, 1)
  np.testing.assert_array_equal(ids[:, 0], [0, 1])


@pytest.mark.slow
def test_end_to_end_finetuning_reads_the_builders_indexes(zebra):
  """The document tower trains (its own, the towers unshared), the builder
  beside the trainer re-embeds its checkpoints until it is done, and `eval`
  scores with the index of the evaluated step. The builder, started first,
  is given the run alone: it waits for the trainer's record of it."""
  model_dir = str(zebra / 'finetune')
  model = [f for f in TINY if f.startswith(('--gin_file', '--gin.BertConfig',
                                            '--gin.build_realm'))]
  model += ['--gin.build_realm.share_towers=False']
  builder = subprocess.Popen(
      [sys.executable, '-m', 'realm_jax.main', 'refresh',
       f'--model_dir={model_dir}', '--poll_seconds=0.2'],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    train_tiny(model_dir, 'finetune', *model, "--gin.Finetune.bert_dir=''",
               '--gin.Finetune.query_length=16', '--gin.train.num_steps=6',
               '--gin.train.checkpoint_every=2',
               '--gin.train.keep_checkpoints=4',
               '--gin.Finetune.train_document_tower=True',
               '--gin.run_refresh.refresh_interval_steps=2')
    builder.wait(timeout=180)
  finally:
    builder.kill()
  log = builder.stdout.read()
  assert builder.returncode == 0, log
  assert 'published index step 6' in log and 'training done' in log, log
  assert 'embedding a step every 2 steps' in log, log  # The trainer's.
  rows = [json.loads(line) for line in
          open(os.path.join(model_dir, 'train_metrics.jsonl'))]
  # Each step read an index of the run's own past (timing decides which).
  assert all(0 <= row['index_staleness'] <= row['step'] for row in rows
             if row['step'])

  manager = run_directory.trainer_checkpoints(model_dir)
  tower = lambda step: jax.tree.leaves(run_directory.restore_retriever_params(
      manager, step)['document_embedder'])
  assert any(not np.array_equal(a, b) for a, b in zip(tower(0), tower(6)))
  predictor = qa_evaluation.QAPredictor(model_dir)
  assert predictor.retrieval.client.params_step == 6
  assert predictor.retrieval.client.index_step == 6


def test_the_builder_embeds_the_index_a_trainer_asks_for_first(dirs, tiny_gin):
  """A lockstep trainer waits for checkpoint 3's index; the builder, whose
  own cadence would embed the newest (6), embeds 3 first."""
  model_dir, corpus_dir = dirs
  trainer = TrainerStandIn(model_dir, corpus_dir)
  for step in range(7):
    trainer.save(step)
  builder = IndexBuilder(model_dir, OpenCorpus(corpus_dir), interval=2)
  run_directory.request_index(model_dir, 3)
  assert builder.poll() == 'published'
  assert run_directory.reload(builder.index) == [3]
  assert builder.poll() == 'published'  # Then its own cadence: the newest.
  assert run_directory.reload(builder.index) == [3, 6]


@pytest.mark.parametrize('damage', ['commit marker deleted', 'a bit flipped'])
def test_the_builder_never_embeds_a_damaged_checkpoint(dirs, tiny_gin,
                                                       caplog, damage):
  """Its commit marker gone, or a bit of its towers flipped, checkpoint 1 is
  refused and named once; saved again whole (the trainer set it aside and
  trained it again), it is embedded."""
  model_dir, corpus_dir = dirs
  trainer = TrainerStandIn(model_dir, corpus_dir)
  trainer.save(0), trainer.save(1)
  builder = IndexBuilder(model_dir, OpenCorpus(corpus_dir))
  builder.last = 0
  item = os.path.join(run_directory.checkpoints_dir(model_dir), '1',
                      run_directory.RETRIEVER_ITEM)
  if damage == 'a bit flipped':
    damaged = largest_file(item)
    flip_a_bit(damaged)
  else:
    damaged = os.path.join(item, 'commit_success.txt')
    os.remove(damaged)
  assert builder.poll() == 'waiting' and builder.poll() == 'waiting'
  assert caplog.text.count('Not embedding step 1: Step ') == 1
  assert damaged in caplog.text
  assert not run_directory.reload(builder.index)
  run_directory.set_aside(run_directory.checkpoints_dir(model_dir), 1)
  trainer.checkpoints.reload()
  trainer.save(1)
  assert builder.poll() == 'published' and builder.last == 1


def _state(step, towers, reader):
  """A trainer state whose parameters are all `step`."""
  full = lambda tree: jax.tree.map(lambda x: np.full_like(x, step), tree)
  return TrainState(step=np.asarray(step), rng=jax.random.key_data(
      jax.random.key(0)), params={'retriever': full(towers),
                                  'reader': full(reader)},
                    opt_state=(full(reader), full(reader)))


def test_retriever_snapshots_between_checkpoints_are_embedded_alone(
    dirs, tiny_gin):
  """With retriever_every = 2 and a checkpoint every 4 steps, the steps
  between hold the towers alone; the builder embeds them as checkpoints,
  a changed corpus is synced with them, and a run resumed from checkpoint
  4 passes over the snapshot 6 it saved before it was stopped."""
  model_dir, corpus_dir = dirs
  towers = init_retriever_params(tiny_retriever(), jax.random.key(0))
  reader = {'kernel': np.zeros((64, 64), np.float32)}
  saving = Checkpoints(model_dir, save_every=4, keep=3, retriever_every=2)
  for step in range(7):
    saving.save(_state(step, towers, reader), step, {'batches': step},
                force=step == 0)
  saving.close()
  snapshots = run_directory.snapshots_dir(model_dir)
  assert run_directory.reload(saving.manager) == [0, 4]
  assert sorted(os.listdir(snapshots)) == ['2', '6']
  assert [p.name for p in epath.Path(snapshots, '6').iterdir()
          if p.is_dir()] == [run_directory.RETRIEVER_ITEM]
  steps = run_directory.RetrieverSteps(model_dir)
  assert steps.reload() == [0, 2, 4, 6]
  assert steps.where(6) == os.path.join(snapshots, '6')
  for leaf in jax.tree.leaves(steps.restore(6)):
    np.testing.assert_array_equal(leaf, 6)

  builder = IndexBuilder(model_dir, OpenCorpus(corpus_dir), interval=2)
  assert builder.poll() == 'published'
  index = publication.read_metadata(builder.index, 6)
  assert index['params_step'] == 6
  for leaf in jax.tree.leaves(_document_tower(model_dir, index)):
    np.testing.assert_array_equal(leaf, 6)

  resumed = Checkpoints(model_dir, save_every=4, keep=3, retriever_every=2)
  assert not resumed.snapshot_due(5) and not resumed.snapshot_due(6)
  assert not resumed.snapshot_due(8)  # A checkpoint's step.
  assert resumed.snapshot_due(10)
  for step in (5, 6):
    assert not resumed.save(_state(step, towers, reader), step,
                            {'batches': step})
  resumed.close()


# The run's record (run.json): what the trainer was given, the builder reads.

MODEL = [f for f in TINY if f.startswith(('--gin_file', '--gin.BertConfig',
                                          '--gin.build_realm'))]
CADENCE = ['--gin.run_refresh.refresh_interval_steps=2',
           '--gin.run_refresh.stale_factor=3']


@pytest.fixture(scope='module')
def recorded(tmp_path_factory, small_corpus):
  """A 2-step tiny pre-training run whose trainer was given the builder's
  cadence, a block cut of 32 and $REALM_DATA_DIR; tests take copies."""
  root = tmp_path_factory.mktemp('recorded')
  model_dir = str(root / 'pretrain')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(corpus.CORPUS_ROOT_ENV, small_corpus)
    patch.setenv(open_qa.DATA_DIR_ENV, str(root / 'data'))
    for name in (default_files.VOCAB_ENV, example_arrays.ROOT_ENV):
      patch.delenv(name, raising=False)
    assert train_tiny(model_dir, 'pretrain', *RETRIEVAL, *CADENCE,
                      '--gin.Pretrain.block_length=32',
                      '--gin.train.num_steps=2') == 0
  gin.clear_config()
  return model_dir


def _copy(model_dir, tmp_path, name='run') -> str:
  return shutil.copytree(model_dir, str(tmp_path / name))


def _index(model_dir) -> dict:
  """{step: (embeddings, metadata)} of the run's published indexes."""
  manager = publication.index_manager(run_directory.index_dir(model_dir),
                                      read_only=True)
  return {step: (publication.read_embeddings(manager, step),
                 publication.read_metadata(manager, step))
          for step in run_directory.reload(manager)}


def test_the_trainer_records_its_corpus_block_cut_cadence_and_environment(
    recorded, small_corpus):
  corpus_dir = os.path.join(small_corpus, 'wiki_leads')
  assert json.loads((epath.Path(recorded) / 'run.json').read_text()) == {
      'kind': 'Pretrain',
      'corpus': {'name': 'wiki_leads', 'dir': corpus_dir,
                 'fingerprint': OpenCorpus(corpus_dir).fingerprint},
      'block_length': 32,
      'refresh': {'refresh_interval_steps': 2, 'stale_factor': 3},
      'environment': {
          corpus.CORPUS_ROOT_ENV: small_corpus,
          open_qa.DATA_DIR_ENV: os.path.join(os.path.dirname(recorded),
                                             'data')}}


def test_a_builder_given_the_run_alone_publishes_what_a_configured_one_did(
    recorded, small_corpus, tmp_path, capsys):
  """`refresh --model_dir=RUN` reads the model from config.gin and the
  corpus, block cut and cadence from run.json: the index it publishes is
  the one the command that was given all of them publishes."""
  alone, told = _copy(recorded, tmp_path, 'alone'), _copy(recorded, tmp_path,
                                                          'told')
  code, printed = run_cli(['refresh', f'--model_dir={alone}',
                           '--poll_seconds=0.05'], capsys)
  assert code == 0, printed
  code, printed = run_cli([
      'refresh', f'--model_dir={told}',
      f'--corpus_dir={small_corpus}/wiki_leads', *MODEL, *CADENCE,
      '--gin.run_refresh.block_length=32', '--poll_seconds=0.05'], capsys)
  assert code == 0, printed
  built, expected = _index(alone), _index(told)
  assert sorted(built) == sorted(expected) == [0, 2]
  embeddings, metadata = built[2]
  np.testing.assert_array_equal(embeddings, expected[2][0])
  assert metadata == expected[2][1] and metadata['block_length'] == 32


def test_the_builder_refuses_what_disagrees_with_the_run_in_one_line(
    recorded, tmp_path, tokenizer, capsys):
  """Another corpus (its fingerprint), or a cadence bound for the builder
  other than the trainer's, is refused before anything is embedded."""
  model_dir = _copy(recorded, tmp_path)
  zebra_data(tmp_path, tokenizer)  # Another corpus of the same name.
  other = str(tmp_path / 'corpora' / 'wiki_leads')
  record = json.loads((epath.Path(model_dir) / 'run.json').read_text())
  code, printed = run_cli(['refresh', f'--model_dir={model_dir}',
                           f'--corpus_dir={other}', *MODEL], capsys)
  assert code == 2 and 'Traceback' not in printed, printed
  [line] = [line for line in printed.splitlines()
            if line.startswith('realm-jax refresh: ')]
  for named in (other, OpenCorpus(other).fingerprint[:16],
                record['corpus']['dir'], record['corpus']['fingerprint'][:16]):
    assert named in line, printed
  code, printed = run_cli(['refresh', f'--model_dir={model_dir}',
                           '--gin.run_refresh.refresh_interval_steps=5'],
                          capsys)
  assert code == 2, printed
  assert ('run_refresh.refresh_interval_steps=5 is bound for the builder, '
          f'but {model_dir}/run.json says the run was trained with 2'
          in printed), printed
  assert _index(model_dir).keys() == {0}


def test_a_run_without_a_record_needs_the_builders_settings(
    recorded, small_corpus, tmp_path, capsys):
  """A run trained before runs recorded their settings: the builder given
  the run alone says what to give it; given them, it builds as before."""
  model_dir = _copy(recorded, tmp_path)
  os.remove(os.path.join(model_dir, 'run.json'))
  code, printed = run_cli(['refresh', f'--model_dir={model_dir}'], capsys)
  assert code == 2, printed
  assert (f'{model_dir} has no run.json: its trainer ran before runs recorded'
          in printed and '--corpus_dir' in printed), printed
  code, printed = run_cli([
      'refresh', f'--model_dir={model_dir}',
      f'--corpus_dir={small_corpus}/wiki_leads', *MODEL,
      '--gin.run_refresh.block_length=32', '--poll_seconds=0.05'], capsys)
  assert code == 0, printed
  assert _index(model_dir)[2][1]['block_length'] == 32
