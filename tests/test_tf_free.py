"""The core without the TensorFlow stack, as a GPU or TPU machine has it.

Every process below starts with TensorFlow, tensorflow-text, seqio, ScaNN,
spaCy and clu unimportable (a sitecustomize.py that marks them absent):
an ICT run, the reader's warm start (random-uniform masking, the null
document alone), REALM pre-training from it with the index builder as a
process of its own swapping indexes in, then `eval`, `search` and `fill`
on the result; Open-QA fine-tuning, then `eval` (the same metrics as the
seqio path's) and `ask`. The examples come from arrays exported here,
where TensorFlow is; the pre-training queries are drawn from the corpus's
span arrays as each batch is made.
"""

import json
import os
import subprocess
import sys

import gin
import pytest

from realm_jax import extras, main, run_directory
from realm_jax.data import example_arrays, span_arrays
from realm_jax.evaluation import masked_lm
from tests import test_layering
from tests.helpers import NQ_TEST, REPO, RETRIEVAL, TINY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ICT = ['--gin_file=gin/runs/ict.gin', *TINY, "--gin.Ict.bert_dir=''",
       '--gin.Ict.block_length=64', '--gin.Ict.query_length=32']
PRETRAIN = ['--gin_file=gin/runs/pretrain.gin', *TINY, *RETRIEVAL]
FINETUNE = ['--gin_file=gin/runs/finetune.gin', *TINY,
            "--gin.Finetune.bert_dir=''", '--gin.Finetune.query_length=16']
ARRAYS = ["--gin.Examples.source='arrays'"]


def _without_tf(tmp_path) -> dict:
  """The environment of a process in which the TF stack is absent."""
  blocker = tmp_path / 'no_tf'
  blocker.mkdir(exist_ok=True)
  # None in sys.modules: `import` fails, and find_spec says "not installed".
  (blocker / 'sitecustomize.py').write_text(
      'import sys\n' + ''.join(f'sys.modules[{name!r}] = None\n'
                               for name in extras.TF_STACK))
  return {**os.environ, 'PYTHONPATH': f'{blocker}{os.pathsep}{REPO}',
          'REALM_ARRAYS_DIR': str(tmp_path / 'arrays'),
          'JAX_PLATFORMS': 'cpu'}


def _run(env, *argv, timeout=600) -> str:
  done = subprocess.run([sys.executable, *argv], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
  return done.stdout + done.stderr


def _rows(model_dir) -> list[dict]:
  with open(os.path.join(model_dir, 'train_metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_train_refresh_eval_and_search_run_without_the_tf_stack(
    small_corpus_env, tmp_path, monkeypatch):
  monkeypatch.setenv(example_arrays.ROOT_ENV, str(tmp_path / 'arrays'))
  for run in (ICT, PRETRAIN):
    gin.clear_config()
    assert main.main(['data', 'export', *run]) == 0
  # Spans and bounds for every masking, not masked copies.
  assert sorted(os.listdir(tmp_path / 'arrays')) == [
      'ict_wiki_leads', 'salient_spans_wiki_leads']
  spans = {split: json.loads((span_arrays.directory('wiki_leads', split) /
                              example_arrays.METADATA).read_text())
           for split in ('train', 'validation')}
  env = _without_tf(tmp_path)
  probe = subprocess.run(
      [sys.executable, '-c', 'import seqio'], env=env, capture_output=True,
      text=True, check=False)
  assert probe.returncode != 0 and 'seqio' in probe.stderr

  ict = str(tmp_path / 'ict')
  _run(env, '-m', 'realm_jax.main', 'train', f'--model_dir={ict}', *ICT,
       *ARRAYS, '--gin.train.num_steps=2')
  assert [r['step'] for r in _rows(ict)][-1] == 2

  reader = str(tmp_path / 'reader')
  _run(env, '-m', 'realm_jax.main', 'train', f'--model_dir={reader}',
       *PRETRAIN, *ARRAYS, "--gin.Pretrain.masking='random_uniform'",
       '--gin.Pretrain.num_candidates=1', '--gin.train.num_steps=2')
  assert [r['step'] for r in _rows(reader)][-1] == 2

  pretrain = str(tmp_path / 'pretrain')
  _run(env, '-m', 'realm_jax.launch_local', f'--model_dir={pretrain}', *PRETRAIN,
       *ARRAYS, f'--gin.Pretrain.ict_model_dir="{ict}"',
       f'--gin.Pretrain.reader_model_dir="{reader}"',
       '--gin.train.num_steps=6', '--gin.train.checkpoint_every=2',
       '--gin.train.log_every=1', '--gin.IndexClient.lockstep_interval=2',
       '--gin.run_refresh.refresh_interval_steps=2', '--poll_seconds=0.2')
  rows = _rows(pretrain)
  assert [r['step'] for r in rows] == [1, 2, 3, 4, 5, 6]
  # The builder's index of step 2 was swapped in for steps 5 and 6 (they
  # retrieve with the parameters of steps 4 and 5; IndexClient's lockstep).
  assert [r['index_staleness'] for r in rows] == [0, 1, 2, 3, 2, 3]
  assert '6' in os.listdir(os.path.join(pretrain, 'index'))
  assert os.listdir(os.path.join(pretrain, 'tensorboard', 'train'))
  for model_dir in (reader, pretrain):  # The data position names the spans.
    with open(os.path.join(run_directory.checkpoints_dir(model_dir), '2',
                           'data_position', 'metadata')) as f:
      position = json.load(f)
    assert position['spans_fingerprint'] == spans['train']['fingerprint']
    assert position['batches'] == 2

  out = _run(env, '-m', 'realm_jax.main', 'eval', f'--model_dir={pretrain}',
             '--task=masked_lm', '--batch_size=8')
  with open(os.path.join(pretrain, 'eval', 'masked_lm_metrics.json')) as f:
    scored = json.load(f)
  # Every held-out span once; an epoch of training, every training span.
  assert scored['queries'] == spans['validation']['spans'] > 0, out
  assert scored['train_queries_an_epoch'] == spans['train']['spans'] > 0
  rows = masked_lm.read_queries(os.path.join(pretrain, 'eval'), 'masked_lm')
  assert scored['masked_token_accuracy'] == pytest.approx(
      sum(r['correct_tokens'] for r in rows)
      / sum(r['masked_tokens'] for r in rows))

  out = _run(env, '-m', 'realm_jax.main', 'search', 'the capital city',
             f'--model_dir={pretrain}', '--top_k=3')
  assert out.count('\n   1 ') + out.count('\n   2 ') + out.count(
      '\n   3 ') == 3, out
  # Quiet here too: Orbax opens the run read-only, and says so only when
  # asked (--verbose).
  assert 'read only' not in out and 'read_only' not in out, out

  out = _run(env, '-m', 'realm_jax.main', 'fill', 'The [MASK] is a city.',
             f'--model_dir={pretrain}')
  assert 'filled: the ' in out and ' is a city .' in out, out
  assert '(null document)' in out, out


def test_finetune_eval_and_ask_run_without_the_tf_stack(zebra, tmp_path,
                                                         monkeypatch):
  """Open-QA scored from the arrays equals the seqio path's scoring."""
  monkeypatch.setenv(example_arrays.ROOT_ENV, str(tmp_path / 'arrays'))
  assert main.main(['data', 'export', *FINETUNE]) == 0
  env = _without_tf(tmp_path)
  model_dir = str(tmp_path / 'finetune')
  _run(env, '-m', 'realm_jax.main', 'train', f'--model_dir={model_dir}',
       *FINETUNE, *ARRAYS, '--gin.train.num_steps=2')
  scored = {}
  _run(env, '-m', 'realm_jax.main', 'eval', f'--model_dir={model_dir}',
       '--task=nq_open', f'--output_dir={tmp_path / "arrays"}')
  gin.clear_config()
  assert main.main(['eval', f'--model_dir={model_dir}', '--task=nq_open',
                    f'--output_dir={tmp_path / "seqio"}',
                    "--gin.Examples.source='seqio'"]) == 0
  for source in ('arrays', 'seqio'):
    with open(tmp_path / source / 'nq_open_metrics.json') as f:
      scored[source] = json.load(f)
  assert scored['arrays']['questions'] == 4
  assert scored['arrays'] == scored['seqio']
  # A file of the same questions: read as it is, no export, the same scores.
  nq_file = tmp_path / 'nq.jsonl'
  nq_file.write_text(''.join(json.dumps({'question': q, 'answer': a}) + '\n'
                             for q, a in NQ_TEST))
  _run(env, '-m', 'realm_jax.main', 'eval', f'--model_dir={model_dir}',
       f'--qa_file={nq_file}', f'--output_dir={tmp_path / "file"}')
  [file_metrics] = (tmp_path / 'file').glob('qa_file_nq_*_metrics.json')
  assert {**json.loads(file_metrics.read_text()), 'task': 'nq_open'} == (
      scored['seqio'])

  out = _run(env, '-m', 'realm_jax.main', 'ask',
             'what animal has black and white stripes?',
             f'--model_dir={model_dir}')
  assert 'Animal' in out or 'Crossings' in out, out  # A block it read.


def test_a_seqio_task_without_the_extra_is_one_line_and_exit_2(tmp_path):
  env = _without_tf(tmp_path)
  done = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'train',
       f'--model_dir={tmp_path / "run"}', *ICT, '--gin.train.num_steps=2'],
      env=env, cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 2, done.stderr[-3000:]
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith('realm-jax train: Reading a seqio task needs seqio, '
                         'which is not installed'), done.stderr
  assert "pip install 'realm-jax[tf]'" in last


def test_every_core_module_imports_without_the_tf_stack():
  """Transitively: a module of the core that imports one that imports TF."""
  modules = [test_layering._module(path) for path in test_layering.CORE]  # pylint: disable=protected-access
  script = ''.join(f'sys.modules[{name!r}] = None\n'
                   for name in extras.TF_STACK) + ''.join(
                       f'importlib.import_module({name!r})\n'
                       for name in modules)
  done = subprocess.run([sys.executable, '-c',
                         'import importlib, sys\n' + script],
                        cwd=REPO, capture_output=True, text=True,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
