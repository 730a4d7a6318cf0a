"""Readers of a run directory survive its writer's pruning, on both sides of
the hand-over: the builder reading trainer checkpoints, and the trainer's
index client (and eval, ask and fill) reading published indexes.

The races are made to happen on purpose: the writer prunes a step right after
Orbax listed it (before it reads the step's commit time), or right before a
step is read. A soak test then runs a real writer process flat out.
"""

import os
import subprocess
import sys
import time

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from orbax.checkpoint._src.path import step as orbax_step

from realm_jax.data import corpus
from realm_jax import run_directory, run_guard
from realm_jax.index import client as client_lib, publication, refresh
from realm_jax.index.client import IndexClient
from tests.helpers import DIM, BuilderStandIn, flip_a_bit, trainer_writer

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_GIN = os.path.join(ROOT, 'gin', 'models', 'tiny.gin')


@pytest.fixture
def dirs(small_corpus, tmp_path):
  return str(tmp_path / 'model'), os.path.join(small_corpus, 'wiki_leads')


def _after_listing(monkeypatch, directory, prune, times: int) -> list:
  """Calls `prune()` right after Orbax lists the steps of `directory`, before
  it reads each one's commit time, on the first `times` listings; returns the
  list of listings seen."""
  listings, original = [], orbax_step._StandardNameFormat.find_all  # pylint: disable=protected-access
  pruning = []  # Not the writer's own listings while it prunes.

  def find_all(self, base_path):
    found = list(original(self, base_path))
    if (not pruning and
        os.path.abspath(str(base_path)) == os.path.abspath(directory)):
      listings.append([m.step for m in found])
      if len(listings) <= times:
        pruning.append(True)
        prune()
        pruning.clear()
    return iter(found)

  monkeypatch.setattr(orbax_step._StandardNameFormat, 'find_all', find_all)  # pylint: disable=protected-access
  return listings


def _before_reading(monkeypatch, handler, prune) -> list:
  """Calls `prune()` once, as `handler` starts restoring its first item."""
  calls, original = [], handler.restore

  def restore(self, directory, *args, **kwargs):
    calls.append(directory)
    if len(calls) == 1:
      prune()
    return original(self, directory, *args, **kwargs)

  monkeypatch.setattr(handler, 'restore', restore)
  return calls


def test_the_client_survives_an_index_pruned_while_listed(dirs, monkeypatch,
                                                          caplog):
  model_dir, corpus_dir = dirs
  builder = BuilderStandIn(model_dir, corpus_dir)
  builder.publish(), builder.publish()
  client = IndexClient(model_dir, builder.meta, dim=DIM)
  listings = _after_listing(monkeypatch, run_directory.index_dir(model_dir),
                            builder.publish, times=2)
  assert client.maybe_refresh()
  assert client.index_step == builder.step == 3
  assert len(listings) >= 3  # Two listings met a pruned step; one did not.
  assert 'vanished while it was listed' in caplog.text
  np.testing.assert_array_equal(client.document_embeddings([0, 5]), 3)


@pytest.mark.parametrize('handler', [ocp.JsonCheckpointHandler,
                                     publication.EmbeddingsHandler],
                         ids=['metadata', 'embeddings'])
def test_the_client_skips_an_index_pruned_while_loaded(dirs, monkeypatch,
                                                       caplog, handler):
  model_dir, corpus_dir = dirs
  builder = BuilderStandIn(model_dir, corpus_dir)
  builder.publish()  # Step 0; its read prunes it (two newer ones are kept).
  client = IndexClient(model_dir, builder.meta, dim=DIM)
  _before_reading(monkeypatch, handler,
                  lambda: (builder.publish(), builder.publish()))
  assert not client.maybe_refresh()
  assert client.searcher is None and client.index_step is None
  assert 'Step 0 of' in caplog.text and 'vanished while it was read' in \
      caplog.text
  assert client.maybe_refresh()  # The next look takes the newest.
  assert client.index_step == 2
  np.testing.assert_array_equal(client.document_embeddings([0, 5]), 2)


def test_restore_params_of_a_run_that_prunes_meanwhile(tmp_path, monkeypatch,
                                                       caplog):
  """eval, ask, fill and warm starts read the newest checkpoint of a run that
  may still be training."""
  model_dir = str(tmp_path / 'run')
  writer, save = trainer_writer(model_dir)
  for step in (10, 20):
    save(step)
  _before_reading(monkeypatch, ocp.StandardCheckpointHandler,
                  lambda: (save(30), save(40)))
  step, params = run_directory.restore_params(model_dir)
  assert step == 40
  assert all(np.all(leaf == 40) for leaf in jax.tree.leaves(params))
  assert 'Step 20 of' in caplog.text
  with pytest.raises(FileNotFoundError, match=r'No checkpoint 20 .* kept: '
                     r'\[30, 40\]'):
    run_directory.restore_params(model_dir, 20)
  writer.close()


def test_the_builder_survives_a_checkpoint_pruned_while_listed(
    dirs, monkeypatch, caplog):
  """The race that stopped `make demo`: the trainer saves and prunes while
  the builder lists its checkpoints."""
  model_dir, corpus_dir = dirs
  writer, save = trainer_writer(model_dir)
  save(0), save(20)
  run_directory.mark_training_done(model_dir)
  saves = iter((40, 60))
  listings = _after_listing(monkeypatch,
                            run_directory.checkpoints_dir(model_dir),
                            lambda: save(next(saves)), times=2)
  gin.parse_config_file(TINY_GIN)
  published = refresh.run_refresh(model_dir, corpus_dir, poll_seconds=0.05,
                                  batch_size=16)
  writer.close()
  assert published == 1 and len(listings) >= 3
  index = publication.index_manager(run_directory.index_dir(model_dir),
                                    read_only=True)
  assert run_directory.reload(index) == [60]
  assert 'vanished while it was listed' in caplog.text


def test_a_listing_rereads_only_when_the_directory_changed(dirs,
                                                          monkeypatch):
  """The client looks for a new index before every step: Orbax's re-read of
  every step's metadata runs only when a step appeared, was pruned or was
  set aside; in a bucket, every time."""
  model_dir, corpus_dir = dirs
  builder = BuilderStandIn(model_dir, corpus_dir, keep=3)
  builder.publish()
  index_dir = run_directory.index_dir(model_dir)
  manager = publication.index_manager(index_dir, read_only=True)
  rereads = []
  original = manager.reload
  monkeypatch.setattr(manager, 'reload',
                      lambda: (rereads.append(1), original())[1])
  listing = run_directory.Listing(manager)
  assert listing.steps() == [0] and len(rereads) == 1
  assert listing.steps() == [0] and listing.steps() == [0]
  assert len(rereads) == 1
  builder.publish()  # Step 1 appears.
  assert listing.steps() == [0, 1] and len(rereads) == 2
  builder.publish(), builder.publish()  # Step 0 pruned.
  assert listing.steps() == [1, 2, 3] and len(rereads) == 3
  run_directory.set_aside(index_dir, 3)
  assert listing.steps() == [1, 2] and len(rereads) == 4
  assert listing.steps() == [1, 2] and len(rereads) == 4
  assert run_directory._entries('gs://bucket/run/index') is None  # pylint: disable=protected-access


def test_writers_prune_by_renaming_into_the_trash_then_empty_it(dirs):
  model_dir, corpus_dir = dirs
  builder = BuilderStandIn(model_dir, corpus_dir)
  for _ in range(4):
    builder.publish()
  index = epath.Path(run_directory.index_dir(model_dir))
  assert sorted(p.name for p in index.iterdir()) == [
      '2', '3', run_directory.TRASH, run_guard.PUBLISH_LOCK]
  assert not list((index / run_directory.TRASH).iterdir())


# A writer process: publishes indexes (the builder) or saves checkpoints
# (the trainer) flat out, keeping 2, until the reader removes `go`; it says
# when its first step is saved, and at the end how many it saved.
WRITER = '''
import os, sys
sys.path.insert(0, {root!r})
from tests.helpers import BuilderStandIn, trainer_writer
step, writer = 0, None
if {kind!r} == 'index':
  builder = BuilderStandIn({model_dir!r}, {corpus_dir!r})
  save = lambda step: builder.publish()
else:
  writer, save = trainer_writer({model_dir!r})
save(step)
print('saved', flush=True)
while os.path.exists({go!r}) or step < 3:
  step += 1
  save(step)
if writer is not None:
  writer.close()
print(step + 1, flush=True)
'''


def _soak(tmp_path, dirs, kind, read, seconds):
  """Runs a writer process flat out while `read()` (one look and read,
  returning the step it read and its values, or None) runs for `seconds`;
  returns (reads, pruned reads, writes)."""
  model_dir, corpus_dir = dirs
  go = tmp_path / 'go'
  go.touch()
  writer = subprocess.Popen(
      [sys.executable, '-c', WRITER.format(
          root=ROOT, kind=kind, model_dir=model_dir, corpus_dir=corpus_dir,
          go=str(go))], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  reads = skipped = 0
  try:
    assert writer.stdout.readline() == 'saved\n'
    end = time.time() + seconds
    while time.time() < end:
      got = read()
      reads += 1
      if got is None:
        skipped += 1
        continue
      step, values = got
      np.testing.assert_array_equal(values, step)  # Whole, not mixed.
  finally:
    go.unlink()
    writes = int(writer.communicate(timeout=120)[0])
  print(f"{kind}: {reads} reads ({skipped} pruned under them), {writes} writes")
  return reads, skipped, writes


@pytest.mark.slow
def test_soak_the_index_client_beside_a_pruning_builder(tmp_path, dirs):
  meta = corpus.load_metadata(dirs[1])
  client = IndexClient(dirs[0], meta, dim=DIM)

  def read():
    if not client.maybe_refresh(force=True) and client.searcher is None:
      return None
    return client.index_step, client.document_embeddings(np.arange(50))

  reads, _, writes = _soak(tmp_path, dirs, 'index', read, seconds=10)
  assert reads >= 200 and writes >= 20 and client.refreshes >= 10


@pytest.mark.slow
def test_soak_the_builder_reading_beside_a_pruning_trainer(tmp_path, dirs):
  manager = run_directory.trainer_checkpoints(dirs[0])

  def read():
    kept = run_directory.reload(manager)
    if not kept:
      return None
    params = run_directory.restore_retriever_params(manager, kept[-1])
    if params is None:
      return None
    return kept[-1], np.concatenate(
        [np.ravel(leaf) for leaf in jax.tree.leaves(params)])

  reads, skipped, writes = _soak(tmp_path, dirs, 'checkpoints', read,
                                 seconds=10)
  assert reads >= 30 and writes >= 20 and skipped < reads


def _damage(step_dir: str, how: str) -> str:
  """Damages a published index step as a crash or a bad disk would; returns
  the file."""
  if how == 'a bit flipped':
    path = os.path.join(step_dir, 'embeddings', 'embeddings.npy')
    flip_a_bit(path)
  elif how == 'truncated embeddings':
    path = os.path.join(step_dir, 'embeddings', 'embeddings.npy')
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)
  elif how == 'commit marker deleted':
    path = os.path.join(step_dir, 'metadata', 'commit_success.txt')
    os.remove(path)
  elif how == 'garbage metadata':
    path = os.path.join(step_dir, 'metadata', 'metadata')
    with open(path, 'wb') as f:
      f.write(b'\x8b\x00garbage{')
  else:  # JSON, but not an index's metadata.
    path = os.path.join(step_dir, 'metadata', 'metadata')
    with open(path, 'w') as f:
      f.write('{"num_blocks": "many"}')
  return path


@pytest.mark.parametrize('how', ['a bit flipped', 'truncated embeddings',
                                 'commit marker deleted', 'garbage metadata',
                                 'wrong metadata'])
def test_a_damaged_index_is_refused_named_and_set_aside(dirs, caplog, how):
  model_dir, corpus_dir = dirs
  builder = BuilderStandIn(model_dir, corpus_dir, keep=3)
  builder.publish(), builder.publish()
  index_dir = run_directory.index_dir(model_dir)
  damaged = _damage(os.path.join(index_dir, '1'), how)
  client = IndexClient(model_dir, builder.meta, dim=DIM)
  assert client.maybe_refresh()
  assert client.index_step == 0  # The previous good step.
  np.testing.assert_array_equal(client.document_embeddings([0, 5]), 0)
  assert f'Refused index step 1: Step {index_dir}/1 is damaged: ' \
      f'{damaged}' in caplog.text
  assert run_directory.reload(client._listing.manager) == [0]  # pylint: disable=protected-access
  aside, = os.listdir(os.path.join(index_dir, run_directory.DAMAGED))
  assert aside.startswith('1-')
  builder.publish()  # Step 2, whole, is served at the next look.
  assert client.maybe_refresh() and client.index_step == 2


def test_lockstep_serves_the_schedule_and_asks_for_what_is_missing(
    dirs, monkeypatch):
  """Interval 2: steps 0-3 read index 0, 4-5 index 2, 6-7 index 4; index
  4 is missing at step 6, so the client asks for it and waits."""
  model_dir, corpus_dir = dirs
  _, save = trainer_writer(model_dir, keep=3)
  for step in (0, 2, 4):
    save(step)
  builder = BuilderStandIn(model_dir, corpus_dir, keep=3)
  builder.publish(), builder.publish(), builder.publish()  # Steps 0, 1, 2.
  client = IndexClient(model_dir, builder.meta, dim=DIM, lockstep_interval=2,
                       poll_seconds=0.01)
  served = []
  for step in range(6):
    client.refresh_for(step)
    served.append(client.index_step)
  assert served == [0, 0, 0, 0, 2, 2]
  builder.publish()  # Step 3: newer, but not the schedule's.
  client.refresh_for(5)
  assert client.index_step == 2
  waits = []
  monkeypatch.setattr(time, 'sleep', lambda _: (
      waits.append(run_directory.requested_index(model_dir)),
      len(waits) == 3 and builder.publish()))  # Step 4, after three looks.
  client.refresh_for(6)
  assert client.index_step == 4 and waits == [4, 4, 4]
  assert run_directory.requested_index(model_dir) is None  # Withdrawn.
  # Index 6 at step 8: the trainer's save of step 6 is still being written
  # when the client first looks; it is listed at the second look and asked
  # for, not refused.
  looks = []
  monkeypatch.setattr(time, 'sleep', lambda _: (
      looks.append(run_directory.requested_index(model_dir)),
      len(looks) == 2 and save(6),
      len(looks) == 4 and builder.publish()))  # Step 6.
  builder.publish()  # Step 5: not the schedule's.
  client.refresh_for(8)
  assert client.index_step == 6 and looks == [None, None, 6, 6]
  monkeypatch.setattr(client_lib, 'SAVE_WAIT_SECONDS', 0.05)
  monkeypatch.setattr(time, 'sleep', lambda _: None)
  with pytest.raises(RuntimeError, match='keeps no checkpoint or retriever '
                     'snapshot of it: save one at every multiple'):
    client.refresh_for(10)  # Index 8: no checkpoint 8 to embed.
