"""One runner for every preset: a preset that exists only as a file runs
through it, stage by stage, and a re-run skips what is done; a preset file
is checked before anything runs."""

import datetime
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from realm_jax import errors
from realm_jax.experiments import demo, runner, world_demo
from realm_jax.experiments import preset as preset_lib
from tests.helpers import REPO


@pytest.mark.integration
@pytest.mark.slow
def test_a_preset_that_is_only_a_file_runs_through_the_runner(
    small_corpus_env, tmp_path, capsys):
  path = os.path.join(REPO, 'tests', 'presets', 'tiny_leads.py')
  results = demo.run(str(tmp_path / 'work'), path)
  assert results['preset'] == 'tiny_leads'
  assert list(results['timings']) == ['corpus', 'ict', 'pretrain_realm',
                                      'masked_lm_realm']
  assert results['ict']['steps_reached'] == 2
  # Its one logged row (steps 1 and 2) holds the compiling first step: no
  # step time is recorded for the next plan to expect.
  assert results['ict']['step_seconds'] is None
  assert results['date'] == datetime.date.today().isoformat()
  assert results['masked_lm']['realm']['queries'] > 0
  assert 'the plan' in capsys.readouterr().out
  saved = json.loads((tmp_path / 'work' / 'results.json').read_text())
  assert saved['masked_lm'] == results['masked_lm']
  # Run again, every stage is done: nothing trains, the same figures.
  again = demo.run(str(tmp_path / 'work'), path)
  assert again['masked_lm'] == results['masked_lm']
  assert again['timings'] == results['timings']


@pytest.mark.unit
def test_a_preset_file_must_define_a_preset_and_known_stage_kinds(tmp_path):
  empty = tmp_path / 'empty.py'
  empty.write_text('NOTHING = 1\n')
  with pytest.raises(errors.BadConfig, match='defines no PRESET'):
    preset_lib.load(str(empty))
  odd = tmp_path / 'odd.py'
  odd.write_text(
      'from realm_jax.experiments.preset import Preset, Stage\n'
      "PRESET = Preset(family='demo', setup='x.gin', sizes={},\n"
      "                stages=(Stage('a', 'dance'),))\n")
  with pytest.raises(errors.BadConfig, match=r"no stage kind \['dance'\]"):
    demo.run(str(tmp_path / 'work'), str(odd))


@pytest.mark.unit
def test_every_shipped_preset_loads_with_stages_its_family_knows():
  families = {'demo': demo.FAMILY, 'world': world_demo.FAMILY}
  assert set(preset_lib.names()) >= {
      'demo', 'reproduce', 'end_to_end', 'gpu', 'world', 'world_small'}
  for name in preset_lib.names():
    preset = preset_lib.load(name)
    kinds = set(runner.KINDS) | set(families[preset.family].kinds)
    assert {stage.kind for stage in preset.stages} <= kinds, name
    assert len({s.name for s in preset.stages}) == len(preset.stages), name


@pytest.mark.integration
@pytest.mark.slow
def test_training_stages_run_side_by_side_each_in_processes_of_its_own(
    small_corpus_env, tmp_path, capsys):
  path = os.path.join(REPO, 'tests', 'presets', 'tiny_side_by_side.py')
  work = tmp_path / 'work'
  results = demo.run(str(work), path)
  assert 'side by side (up to 2 training stages at once' in (
      capsys.readouterr().out)
  for run in ('ict', 'reader', 'realm', 'baseline'):
    # Each trainer printed to its run's log, not to this console.
    assert 'step' in (work / run / 'train.log').read_text(), run
  assert (work / 'realm' / 'refresh.log').exists()
  assert results['pretrain_realm']['steps_reached'] == 2
  assert results['pretrain_realm']['index_steps_kept']
  assert results['pretrain_baseline']['steps_reached'] == 2
  assert {'baseline', 'realm'} <= set(results['masked_lm'])
  # The stages overlapped: the run took less than its stages one by one,
  # and each records how many stepped beside it (the next plan's share).
  assert results['wall_seconds'] < sum(results['timings'].values())
  assert results['pretrain_realm']['steps_beside'] >= 1.0
  assert results['pretrain_realm']['began_s'] > results['ict']['began_s']


@pytest.mark.unit
def test_stages_wait_for_the_runs_they_read_and_a_failure_stops_the_rest():
  spec = preset_lib.load(os.path.join(REPO, 'tests', 'presets',
                                      'tiny_side_by_side.py'))
  after = preset_lib.after(spec.stages, spec.concurrent)
  assert after['ict'] == after['reader'] == ['corpus', 'machine']
  assert after['pretrain_realm'] == ['corpus', 'machine', 'ict', 'reader']
  assert after['masked_lm_realm'] == ['corpus', 'machine', 'pretrain_realm']
  # One at a time, each waits for the one before it.
  assert preset_lib.after(spec.stages)['pretrain_baseline'] == [
      'pretrain_realm']
  kept, stopped = [], []

  def fails():
    raise ValueError('out of memory')

  def waits_for_cancel():
    assert beside.cancel.wait(10)
    stopped.append(True)

  beside = runner._Beside(2, lambda stage, record: kept.append(stage.name))
  beside.start(spec.stage('ict'), lambda: {'seconds': 1.0})
  beside.wait('the reader', lambda: kept == ['ict'])
  beside.start(spec.stage('pretrain_realm'), waits_for_cancel)
  beside.start(spec.stage('pretrain_baseline'), fails)
  with pytest.raises(ValueError, match='out of memory'):
    beside.wait('the end', lambda: not beside.running)
  assert stopped == [True] and kept == ['ict']


@pytest.mark.unit
def test_how_many_stages_stepped_beside_each_other():
  # a steps from 10 s to 110 s; b from 60 s to 110 s; c alone, later
  # (each its last steps x step time of the stage).
  records = {'a': {'began_s': 0.0, 'steps_reached': 100,
                   'step_seconds': 1.0, 'seconds': 110.0},
             'b': {'began_s': 0.0, 'steps_reached': 50, 'step_seconds': 1.0,
                   'seconds': 110.0},
             'c': {'began_s': 120.0, 'steps_reached': 10,
                   'step_seconds': 2.0, 'seconds': 25.0},
             'scored': {'seconds': 3.0}}
  beside = runner.steps_beside(records)
  assert beside == pytest.approx({'a': 1.5, 'b': 2.0, 'c': 1.0})


@pytest.mark.integration
@pytest.mark.slow
def test_a_kill_of_the_runner_stops_the_stages_beside_it(small_corpus_env,
                                                         tmp_path):
  path = os.path.join(REPO, 'tests', 'presets', 'tiny_side_by_side.py')
  runner_process = subprocess.Popen(
      [sys.executable, '-m', 'realm_jax.main', 'demo', f'--preset={path}',
       f'--work_dir={tmp_path / "work"}'], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  pids = {}
  try:
    for line in runner_process.stdout:
      found = re.match(r'(ict|reader) trainer: pid (\d+)', line)
      if found:
        pids[found.group(1)] = int(found.group(2))
      if len(pids) == 2:
        break
    assert set(pids) == {'ict', 'reader'}
    runner_process.send_signal(signal.SIGTERM)
    assert runner_process.wait(60) != 0
  finally:
    runner_process.kill()
  # Both trainers stopped with it: none left writing to the runs.
  for pid in pids.values():
    try:
      os.kill(pid, 0)
      with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
        assert f.read().rsplit(')', 1)[1].split()[0] == 'Z', pid
    except (ProcessLookupError, FileNotFoundError):
      pass
  assert not (tmp_path / 'work' / 'stages' / 'ict.json').exists()
