"""One runner for every preset: a preset that exists only as a file runs
through it, stage by stage, and a re-run skips what is done; a preset file
is checked before anything runs."""

import datetime
import json
import os

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
