"""A preset's plan: expected times from its recorded run, and the budget
shared out among the stages still to run."""

import json

import pytest
from etils import epath

from realm_jax import stage_plan

pytestmark = pytest.mark.unit

SIZES = {'ict_steps': 200, 'reader_steps': 100, 'pretrain_steps': 400}
RECORD = {
    'machine': {'device': 'NVIDIA H100 80GB HBM3'},
    'sizes': {'ict_steps': 100, 'reader_steps': 100, 'pretrain_steps': 100},
    'timings': {'ict': 30.0, 'reader': 50.0, 'pretrain_realm': 70.0,
                'masked_lm_realm': 10.0},
    # Where a stage kept its step time: its start, then its steps.
    'pretrain_realm': {'step_seconds': 0.2},
}
STAGES = ['ict', 'reader', 'pretrain_realm', 'pretrain_stale',
          'masked_lm_realm', 'masked_lm_stale', 'recall_realm']


def test_each_stage_is_expected_from_the_record_at_its_steps_now():
  plan = stage_plan.Plan(STAGES, SIZES, RECORD)
  assert plan.expected == {
      'ict': 60.0,  # No step time kept: scaled whole, 2x the steps.
      'reader': 50.0,
      # 70 s = a 50 s start and 100 steps of 0.2 s; now 400 steps.
      'pretrain_realm': 130.0, 'pretrain_stale': 130.0,
      'masked_lm_realm': 10.0, 'masked_lm_stale': 10.0,
      'recall_realm': None}  # Nothing of its kind recorded.
  assert plan.total() == 390.0
  lines = '\n'.join(plan.lines())
  assert '| pretrain_stale | 400 | 130 |' in lines
  assert '| recall_realm |  | ? |' in lines and 'H100' in lines
  on_cpu = {**RECORD, 'machine': {'cpu': 'AMD EPYC', 'cores': 2}}
  assert 'recorded run on AMD EPYC, 2 cores' in '\n'.join(
      stage_plan.Plan(STAGES, SIZES, on_cpu).lines())


def test_a_stage_that_sets_its_own_steps_is_planned_at_them():
  # The start: REALM's run for no step, as its record has it.
  record = {**RECORD, 'timings': {**RECORD['timings'], 'pretrain_start': 5.0}}
  plan = stage_plan.Plan(['pretrain_realm', 'pretrain_start'], SIZES, record,
                         steps={'pretrain_start': 0})
  assert plan.expected['pretrain_start'] == 5.0
  lines = '\n'.join(plan.lines())
  assert '| pretrain_start | 0 | 5 |' in lines
  assert '| pretrain_realm | 400 | 130 |' in lines


def test_a_stage_its_budget_stopped_is_expected_from_the_steps_it_reached():
  # The record's REALM run stopped at step 20 of 100: 70 s = a 66 s start
  # and 20 steps of 0.2 s; its 400 steps now take 66 + 80 s.
  cut = {**RECORD, 'pretrain_realm': {'step_seconds': 0.2,
                                      'steps_reached': 20}}
  plan = stage_plan.Plan(STAGES, SIZES, cut)
  assert plan.expected['pretrain_realm'] == pytest.approx(146.0)


def test_the_newest_measure_of_the_stages_is_the_one_planned_from(tmp_path):
  docs = epath.Path(tmp_path)
  assert stage_plan.recorded('gpu', docs) is None
  (docs / 'gpu.json').write_text(json.dumps(RECORD))  # No date: the oldest.
  assert stage_plan.recorded('gpu', docs) == RECORD
  timed = {**RECORD, 'date': '2026-11-27', 'timings': {'ict': 5.0}}
  (docs / 'gpu_stage_times_h100.json').write_text(json.dumps(timed))
  assert stage_plan.recorded('gpu', docs)['timings'] == {'ict': 5.0}
  (docs / 'gpu.json').write_text(json.dumps({**RECORD, 'date': '2026-12-01'}))
  assert stage_plan.recorded('gpu', docs)['date'] == '2026-12-01'


def test_a_record_of_several_runs_is_planned_from_its_first(tmp_path):
  # `--repeats` writes each run's record under 'runs' and nothing of a
  # run's own at the top: read as it was, every stage had nothing to
  # expect.
  docs = epath.Path(tmp_path)
  second = {**RECORD, 'timings': {'ict': 90.0}}
  (docs / 'world.json').write_text(json.dumps(
      {'preset': 'world', 'repeats': {'runs': 2}, 'runs': [RECORD, second]}))
  assert stage_plan.recorded('world', docs)['timings'] == RECORD['timings']
  plan = stage_plan.Plan(STAGES, SIZES, stage_plan.recorded('world', docs))
  assert plan.expected['ict'] == 60.0


def test_without_a_record_nothing_is_expected_and_without_a_budget_no_limit():
  plan = stage_plan.Plan(STAGES, SIZES)
  assert set(plan.expected.values()) == {None} and plan.total() is None
  assert plan.time_limit('ict') is None
  assert 'no recorded run' in '\n'.join(plan.lines())


def test_the_budget_left_is_shared_by_the_stages_still_to_run(monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(stage_plan.time, 'monotonic', lambda: clock[0])
  plan = stage_plan.Plan(STAGES, SIZES, RECORD, budget_s=195.0)
  assert 'over it' in '\n'.join(plan.lines())  # 390 s expected.
  # Half the expected time: each stage gets half its own (recall_realm,
  # with none, the mean of the others: 65 s, so 32.5 s).
  assert plan.time_limit('ict') == pytest.approx(195 * 60 / 455)
  plan.finish('ict')
  clock[0] += 100.0  # ICT ran over its share: the rest share what is left
  # (the mean of those known is 66 s now).
  assert plan.time_limit('reader') == pytest.approx(95 * 50 / 396)
  clock[0] += 500.0
  assert plan.time_limit('reader') == 0.0  # Spent: one step, then it ends.


def test_stages_side_by_side_overlap_their_starts_and_share_the_device(
    monkeypatch):
  monkeypatch.setattr(stage_plan.time, 'monotonic', lambda: 1000.0)
  record = {**RECORD, 'pretrain_realm': {'step_seconds': 0.2},
            'timings': {**RECORD['timings'], 'recall_realm': 10.0}}
  after = {'ict': [], 'reader': [], 'pretrain_realm': ['ict', 'reader'],
           'pretrain_stale': ['ict', 'reader'],
           'masked_lm_realm': ['pretrain_realm'],
           'masked_lm_stale': ['pretrain_stale'],
           'recall_realm': ['pretrain_realm']}
  plan = stage_plan.Plan(STAGES, SIZES, record, budget_s=200.0, after=after,
                         background=STAGES[:4], concurrent=2)
  # ICT (60 s, nothing but its start known) beside the reader (50 s); at
  # 60 s both pre-training runs: 50 s starts, then 80 s of steps each,
  # sharing the device, 160 s; the three scorings, 30 s, one at a time.
  assert plan.wall() == pytest.approx(60 + 50 + 160 + 30)
  assert plan.total() == 400.0
  assert '| side by side (up to 2 training stages at once' in '\n'.join(
      plan.lines())
  # Each gets its share of the budget by its length in that schedule.
  assert plan.time_limit('pretrain_realm') == pytest.approx(
      200 * 210 / 300)
  one_by_one = stage_plan.Plan(STAGES, SIZES, record, after=after,
                               background=STAGES[:4])
  assert one_by_one.wall() == one_by_one.total() == 400.0


def test_without_a_record_stages_side_by_side_share_the_budget(monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(stage_plan.time, 'monotonic', lambda: clock[0])
  after = {'ict': [], 'reader': [], 'pretrain_realm': ['ict', 'reader'],
           'pretrain_stale': ['ict', 'reader']}
  stages = list(after)
  plan = stage_plan.Plan(stages, SIZES, budget_s=90.0, after=after,
                         background=stages, concurrent=2)
  assert plan.wall() is None
  # Nothing expected: each counts as 1 s; two at once, two waves: each
  # stage may take its second and all that the schedule leaves.
  assert plan.time_limit('ict') == pytest.approx(89.0)
  plan.start('ict')
  plan.start('reader')
  clock[0] += 30.0  # Both ran past what they were expected to take.
  plan.finish('ict')
  # The reader expected to end now, both runs side by side after it: each
  # may take all that is left.
  assert plan.time_limit('pretrain_realm') == pytest.approx(60.0)


def test_a_stage_timed_beside_others_is_expected_at_its_share_of_the_device():
  # 100 steps at 0.2 s while another stage stepped too: 0.1 s of the
  # device a step, which the schedule shares again.
  beside = {**RECORD, 'pretrain_realm': {'step_seconds': 0.2,
                                         'steps_beside': 2.0}}
  plan = stage_plan.Plan(STAGES, SIZES, beside)
  assert plan.parts['pretrain_realm'] == pytest.approx((50.0, 40.0))


@pytest.mark.parametrize('budget, expected', [(250.0, 100.0), (100.0, 25.0)])
def test_a_stage_takes_what_the_schedule_leaves_of_the_budget(
    monkeypatch, budget, expected):
  monkeypatch.setattr(stage_plan.time, 'monotonic', lambda: 0.0)
  plan = stage_plan.Plan(['a', 'b'], {}, budget_s=budget)
  plan.parts = {'a': (50.0, 0.0), 'b': (50.0, 100.0)}
  plan.expected = {'a': 50.0, 'b': 150.0}
  # 200 s expected: under a budget of 250 s, `a` may take its 50 s and
  # the 50 s the schedule leaves; over one of 100 s, its share, a quarter.
  assert plan.time_limit('a') == pytest.approx(expected)
