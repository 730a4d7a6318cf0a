"""`realm-jax fill`: the marginal over the retrieved documents, with provenance."""

import json
import os
import shutil

import gin
import numpy as np
import pytest

from realm_jax import aot, main, run_directory
from realm_jax.evaluation import masked_lm, prediction
from realm_jax.training import run_loader


@pytest.mark.unit
def test_cloze_query_makes_one_mask_token_per_mask(tokenizer):
  ids, positions = prediction.cloze_query(
      tokenizer, 'The [MASK] is the capital of [MASK].', 32)
  assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
  assert [ids[p] for p in positions] == [tokenizer.mask_id] * 2
  assert positions == [2, 7]
  with pytest.raises(ValueError, match='No \\[MASK\\]'):
    prediction.cloze_query(tokenizer, 'no blank here', 32)


@pytest.mark.unit
def test_fill_marginal_is_the_mixture_of_the_conditionals():
  rng = np.random.default_rng(0)
  scores = rng.standard_normal((2, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
  logits = rng.standard_normal((2, 4, 3, 11)).astype(np.float32)
  log_p_z, log_p_y_z, log_marginal = prediction.fill_distribution(
      scores, mask, logits)
  p_z = np.where(mask, np.exp(scores), 0)
  p_z /= p_z.sum(-1, keepdims=True)
  p_y_z = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(np.exp(log_marginal),
                             np.einsum('bk,bkmv->bmv', p_z, p_y_z), atol=1e-6)
  np.testing.assert_allclose(np.exp(log_marginal).sum(-1), 1, atol=1e-6)
  np.testing.assert_allclose(np.exp(log_p_z), p_z, atol=1e-6)
  np.testing.assert_allclose(np.exp(log_p_y_z), p_y_z, atol=1e-6)


def _copy(run: str, tmp_path) -> str:
  return shutil.copytree(run, str(tmp_path / 'pretrain'))


@pytest.mark.integration
@pytest.mark.usefixtures('small_corpus_env')
def test_fill_prints_the_marginal_and_every_document(
    trained_pretraining, tmp_path, capsys, monkeypatch):
  model_dir = _copy(trained_pretraining, tmp_path)
  monkeypatch.chdir(tmp_path)  # A relative model_dir, as from the shell.
  loaded = run_loader.load_run('pretrain')
  assert (loaded.kind, loaded.model_dir, loaded.step, loaded.index_step) == (
      'Pretrain', model_dir, 2, 0)  # The trainer's own first index.
  assert 'Pretrain.num_candidates = 4' in loaded.config
  assert loaded.run.objective.num_candidates == 4
  # What `realm-jax aot --model_dir` compiles: the run's own step.
  train_step = aot.compile_and_fit(
      loaded.run, loaded.batch_size, loaded.num_steps, 1, builder_devices=1,
      num_blocks=100, block_length=32, embed_batch_size=8, search_queries=4,
      search_k=4, search_dtype='float32')[0]
  assert train_step.name == 'train step (Pretrain)' and train_step.flops > 0
  result = prediction.ClozePredictor('pretrain').fill(
      'The [MASK] is the capital of France.')
  assert '[MASK]' not in result['filled'] and 'capital' in result['filled']
  documents = result['documents']
  assert documents[0]['title'] == '(null document)'
  assert len(documents) == 4 and all(d['title'] for d in documents)
  np.testing.assert_allclose(sum(d['p_z'] for d in documents), 1, atol=1e-5)
  # p(y*|x) = sum_z p(z|x) p(y*|z,x) for the filled token y*.
  best_token, best_p = result['masks'][0][0]
  np.testing.assert_allclose(
      sum(d['p_z'] * d['p_y_given_z'][0] for d in documents), best_p,
      rtol=1e-4)
  assert best_token in result['filled']
  gin.clear_config()
  main.main(['fill', 'The [MASK] is the capital of France.',
             f'--model_dir={model_dir}'])
  out = capsys.readouterr().out
  assert 'filled:' in out and '(null document)' in out and 'p(z|x)' in out
  # A file of sentences, one loaded model; a bad line is counted, not fatal.
  texts = ['The [MASK] is the capital of France.', 'no blank here',
           'Paris is the [MASK] of [MASK].']
  source, output = tmp_path / 'texts.txt', tmp_path / 'filled.jsonl'
  source.write_text(f'{texts[0]}\n{texts[1]}\n\n{texts[2]}\n')
  gin.clear_config()
  main.main(['fill', f'--texts={source}', f'--model_dir={model_dir}',
             f'--output={output}'])
  captured = capsys.readouterr()
  assert captured.out.count('filled:') == 2
  assert captured.out.count('[MASK] 2: p(y|x)') == 1
  assert f'{source}:2: No [MASK]' in captured.err
  assert f'not fillable: 1 (e.g. {source}:2)' in captured.err
  rows = [json.loads(line) for line in output.read_text().splitlines()]
  assert [r['text'] for r in rows] == [texts[0], texts[2]]
  assert [len(r['masks']) for r in rows] == [1, 2]
  for row in rows:
    assert '[MASK]' not in row['filled'] and len(row['documents']) == 4
    assert sum(d['p_z'] for d in row['documents']) == pytest.approx(
        1, abs=1e-5)


@pytest.mark.integration
@pytest.mark.usefixtures('small_corpus_env')
def test_masked_lm_eval_with_and_without_retrieval(trained_pretraining,
                                                   tmp_path):
  model_dir = _copy(trained_pretraining, tmp_path)
  out = str(tmp_path / 'eval')
  realm = masked_lm.evaluate(model_dir, out, 'realm', batch_size=8,
                             max_queries=20)
  alone = masked_lm.evaluate(model_dir, out, 'alone', batch_size=8,
                             max_queries=20,
                             gin_bindings=['Pretrain.num_candidates = 1'])
  assert realm['step'] == realm['index_step'] == 2  # Embedded for step 2.
  assert realm['num_candidates'] == 4 and alone['num_candidates'] == 1
  assert realm['queries'] == alone['queries'] == 20
  assert alone['retrieval_utility'] == 0  # The null document alone.
  rows = masked_lm.read_queries(out, 'alone')
  assert len(rows) == 20 and alone['masked_token_accuracy'] == pytest.approx(
      sum(r['correct_tokens'] for r in rows)
      / sum(r['masked_tokens'] for r in rows))
  with open(f'{out}/alone_metrics.json') as f:
    assert json.load(f)['num_candidates'] == 1
  rows_realm = masked_lm.read_queries(out, 'realm')
  rows_alone = masked_lm.read_queries(out, 'alone')
  # The metrics are ratios of the per-query sums; the queries pair up.
  assert masked_lm.summarize(rows_realm)['loss'] == pytest.approx(
      realm['loss'])
  compared = masked_lm.compare(rows_realm, rows_alone)
  assert compared['masked_token_accuracy']['items'] == 20
  assert compared['log_likelihood']['difference'] == pytest.approx(
      alone['loss'] - realm['loss'], abs=1e-9)
  with pytest.raises(ValueError, match='different queries'):
    masked_lm.compare(rows_realm, rows_alone[1:])
  # The null document's terms, scored in REALM's own pass, are those of
  # the same reader run with the null document alone.
  for own, separate in zip(masked_lm.null_document(rows_realm), rows_alone):
    assert own['correct_tokens'] == separate['correct_tokens']
    assert own['log_likelihood'] == pytest.approx(separate['log_likelihood'],
                                                  rel=1e-4, abs=1e-4)
  assert realm['null_document_accuracy'] == alone['masked_token_accuracy']


@pytest.mark.integration
@pytest.mark.usefixtures('small_corpus_env')
def test_a_kept_step_older_than_the_newest_index_is_scored_with_its_own(
    trained_pretraining, tmp_path):
  """Scoring a run along its training: with three indexes newer than its
  first checkpoint and none of it, the first one's is embedded and served,
  and the newer ones all stay."""
  model_dir = _copy(trained_pretraining, tmp_path)
  index = run_directory.index_dir(model_dir)
  out = str(tmp_path / 'eval')
  last = masked_lm.evaluate(model_dir, out, 'last', batch_size=8,
                            max_queries=8)
  assert (last['step'], last['index_step']) == (2, 2)
  shutil.rmtree(os.path.join(index, '0'), ignore_errors=True)
  for newer in ('3', '4'):  # As a builder publishing past it would leave.
    shutil.copytree(os.path.join(index, '2'), os.path.join(index, newer))
  first = masked_lm.evaluate(model_dir, out, 'first', batch_size=8,
                             max_queries=8, step=0)
  assert (first['step'], first['index_step']) == (0, 0)
  assert {'0', '2', '3', '4'} <= set(os.listdir(index))
