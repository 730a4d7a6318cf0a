"""The t5x adapter, driven as t5x drives a model (t5x is not installable
here): seqio.Evaluator with get_infer_fn-style steps, t5x's BaseModel
signatures, and the loss and scores against the run kind and the formulas."""

import functools
import inspect
import json

import jax
import numpy as np
import pytest
import seqio
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P
from seqio.metrics import ModelOutputType

from realm_jax.data import corpus
from realm_jax.data import metrics
from realm_jax.evaluation.t5x_adapter import (RealmQAModel, best_answers,
                                              top_k_inner_products)
from realm_jax.index.exact import exact_search
from realm_jax.training.step_inputs import token_arrays
from realm_jax.input.tasks import open_qa as open_qa_tasks
from tests import helpers

EMPTY = inspect.Parameter.empty
# t5x's BaseModel (t5x/models.py): each method's parameters after `self`,
# with their defaults. t5x calls them by these names and positions; any
# further parameter must have a default.
T5X_BASE_MODEL = {
    'get_initial_variables': (('rng', EMPTY), ('input_shapes', EMPTY),
                              ('input_types', None)),
    'loss_fn': (('params', EMPTY), ('batch', EMPTY), ('dropout_rng', EMPTY)),
    'eval_fn': (('params', EMPTY), ('batch', EMPTY)),
    'predict_batch': (('params', EMPTY), ('batch', EMPTY), ('rng', None)),
    'predict_batch_with_aux': (('params', EMPTY), ('batch', EMPTY),
                               ('rng', None)),
    'score_batch': (('params', EMPTY), ('batch', EMPTY),
                    ('return_intermediates', False)),
}
SCORED_TASK = 'nq_open_t5x_adapter_test'


@pytest.mark.unit
def test_methods_have_the_signatures_of_t5x_base_model():
  for name, expected in T5X_BASE_MODEL.items():
    parameters = list(inspect.signature(
        getattr(RealmQAModel, name)).parameters.values())
    assert parameters[0].name == 'self', name
    got = parameters[1:len(expected) + 1]
    assert [(p.name, p.default) for p in got] == list(expected), name
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in got), name
    assert all(p.default is not EMPTY
               for p in parameters[len(expected) + 1:]), name
  converter = RealmQAModel.FEATURE_CONVERTER_CLS(pack=False)  # As eval.py.
  assert isinstance(converter, seqio.FeatureConverter) and not converter.pack
  with pytest.raises(ValueError, match='never packed'):
    RealmQAModel.FEATURE_CONVERTER_CLS(pack=True)


@pytest.mark.unit
def test_host_search_equals_the_device_search_ties_included():
  rng = np.random.default_rng(0)
  # Small integers: every inner product is exact, so ties are real ties.
  rows = rng.integers(-3, 4, (50, 8)).astype(np.float32)
  rows[[10, 20]] = rows[3]
  queries = np.concatenate([rng.integers(-3, 4, (3, 8)), 10 * rows[3:4]])
  for k in (1, 2, 7, 50):
    scores, ids = top_k_inner_products(queries.astype(np.float32), rows, k)
    expected_scores, expected_ids = exact_search(queries, rows, k)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(scores, expected_scores)
  # Rows 3, 10 and 20 tie for the last query: the lower ids come first.
  assert top_k_inner_products(queries[3:], rows, 2)[1].tolist() == [[3, 10]]


@pytest.mark.unit
def test_best_answer_adds_the_spans_that_spell_it():
  sep = 3
  # Two candidates, the second reading 9 twice; z0 holds a [SEP] at 3.
  reader = np.array([[[1, 7, 8, 3, 9, 0], [1, 7, 8, 9, 9, 0]]] * 3)
  starts = np.array([[[1, 2], [3, 4]], [[1, 4], [3, 4]], [[1, 2], [3, 4]]])
  widths = np.array([[[1, 1], [0, 0]], [[1, 0], [0, 0]], [[1, 1], [0, 0]]])
  log_p_z = np.log([[0.6, 0.4], [0.5, 0.5], [0.5, 0.5]])
  span_p = np.array([
      # [8, 3] (0.48) crosses the [SEP]: [9] (0.4 * (0.7 + 0.3)) wins.
      [[0.2, 0.8], [0.7, 0.3]],
      # The likeliest span, [7, 8] (0.35), loses to [9] added over both.
      [[0.7, 0.3], [0.6, 0.4]],
      # No span at all.
      [[0.0, 0.0], [0.0, 0.0]]])
  with np.errstate(divide='ignore'):
    answers, log_p = best_answers(log_p_z, np.log(span_p), starts, widths,
                                  reader, 3, sep)
  np.testing.assert_array_equal(answers, [[9, 0, 0], [9, 0, 0], [0, 0, 0]])
  np.testing.assert_allclose(np.exp(log_p), [0.4, 0.15 + 0.5, 0.0],
                             rtol=1e-6)

  # ORQA's rule: the single best span, [7, 8] (0.35) in the second question.
  with np.errstate(divide='ignore'):
    answers, log_p = best_answers(log_p_z, np.log(span_p), starts, widths,
                                  reader, 3, sep, rule='best_span')
  np.testing.assert_array_equal(answers, [[9, 0, 0], [7, 8, 0], [0, 0, 0]])
  np.testing.assert_allclose(np.exp(log_p), [0.4 * 0.7, 0.35, 0.0],
                             rtol=1e-6)


def _write_zebra(root, tokenizer):
  """test_qa_evaluation's zebra corpus and QA data, under `root`."""
  source = root / 'articles.jsonl'
  source.write_text(''.join(json.dumps(a) + '\n' for a in helpers.ARTICLES))
  corpus.build_corpus(str(root / 'corpora' / 'wiki_leads'), tokenizer,
                      jsonl_paths=[str(source)])
  nq = root / 'data' / 'nq_open'
  nq.mkdir(parents=True)
  (nq / 'topics.nq.dev.txt').write_text(''.join(
      f'{q}\t{a!r}\n' for q, a in helpers.NQ_TEST))
  (nq / 'NQ-open.dev.jsonl').write_text(''.join(
      json.dumps({'question': q, 'answer': a}) + '\n'
      for q, a in helpers.NQ_TEST))


@pytest.fixture(scope='module')
def qa_model(tmp_path_factory, tokenizer):
  """A 2-step fine-tuning run over the zebra corpus, as a t5x model that
  keeps each candidate's best span (top_spans=1)."""
  root = tmp_path_factory.mktemp('t5x')
  _write_zebra(root, tokenizer)
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('REALM_CORPUS_DIR', str(root / 'corpora'))
    patch.setenv('REALM_DATA_DIR', str(root / 'data'))
    yield RealmQAModel(helpers.finetuned(root), top_spans=1)


def _flat_reader(params):
  """Every span scores 0 (test_qa_evaluation._flat_reader), on a copy: each
  block's best span is its first wordpiece, 'zebra', which every block has
  once."""
  head = params['reader']['span_head']
  head = {**head, 'score': jax.tree.map(np.zeros_like, head['score'])}
  return {**params, 'reader': {**params['reader'], 'span_head': head}}


def _infer_fn(infer_step, batch_size: int):
  """t5x.utils.get_infer_fn on one host, rewritten: a step partitioned like
  t5x's (jitted, the batch and indices split over a 'data' mesh axis of
  `batch_size` devices, parameters replicated) over whole batches of the
  enumerated dataset (the last one filled with its first example under
  index -1), the rng split per batch and passed when the step takes one,
  the padding dropped, outputs ordered by index with every leaf a list, and
  aux values (a dict beside the outputs) split off."""
  takes_rng = 'rng' in inspect.signature(infer_step).parameters
  mesh = jax.make_mesh((batch_size,), ('data',),
                       devices=jax.devices()[:batch_size])
  data, replicated = (NamedSharding(mesh, P('data')),
                      NamedSharding(mesh, P()))

  @functools.partial(jax.jit, in_shardings=(replicated, data, replicated,
                                            data),
                     out_shardings=replicated)
  def step(params, batch, rng, indices):
    return indices, (infer_step(params, batch, rng) if takes_rng
                     else infer_step(params, batch))

  def infer_fn(ds, params, rng=None):
    count = len(ds)
    if count % batch_size:
      ds = ds.concatenate(ds.take(1).map(lambda i, x: (np.int64(-1), x))
                          .repeat(batch_size - count % batch_size))
    indices, outputs = [], []
    for index, batch in ds.batch(batch_size,
                                 drop_remainder=True).as_numpy_iterator():
      step_rng = None
      if rng is not None:
        step_rng, rng = jax.random.split(rng)
      batch_indices, result = jax.device_get(step(params, batch, step_rng,
                                                  index))
      indices.append(batch_indices)
      outputs.append(result)
    indices = np.concatenate(indices)
    outputs = jax.tree.map(lambda *x: np.concatenate(x), *outputs)
    order = [i for i in np.argsort(indices) if indices[i] >= 0]
    outputs = jax.tree.map(lambda x: x[order], outputs)
    aux = None
    if isinstance(outputs, tuple) and isinstance(outputs[1], dict):
      outputs, aux = outputs
    assert len(order) == count
    pairs = [(int(indices[i]), np.asarray(outputs[n]).tolist())
             for n, i in enumerate(order)]
    if aux is None:
      return pairs
    return pairs, jax.tree.map(lambda x: np.asarray(x).tolist(), aux)

  return infer_fn


def _target_found(targets, scores):
  """A score metric: how many targets some retrieved block spells."""
  del targets
  return {'target_found': 100.0 * float(np.mean(np.isfinite(scores)))}


def _mean_p_answer(targets, predictions, aux_values):
  """A predict-with-aux metric: the mean p(y|x) of the predicted answers."""
  del targets, predictions
  return {'mean_p_answer': float(np.mean(np.exp(aux_values['scores'])))}


def _register_scored_task():
  """nq_open with a score and an aux metric beside exact match, so seqio
  calls all three of t5x's inference functions."""
  if SCORED_TASK in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(SCORED_TASK)
  nq = seqio.get_mixture_or_task('nq_open')
  seqio.TaskRegistry.add(
      SCORED_TASK, source=nq.source, preprocessors=nq.preprocessors,
      output_features=nq.output_features, postprocess_fn=nq.postprocess_fn,
      metric_fns=[metrics.exact_match, _target_found, _mean_p_answer])


def _evaluator(qa_model, task: str) -> seqio.Evaluator:
  """t5x's eval.py: an InferenceEvaluator over the task's test split."""
  return seqio.Evaluator(
      mixture_or_task_name=task,
      feature_converter=qa_model.FEATURE_CONVERTER_CLS(pack=False),
      eval_split='test', use_cached=False, seed=42,
      sequence_length=qa_model.task_feature_lengths, use_memory_cache=True,
      logger_cls=())


@pytest.mark.integration
@pytest.mark.slow
def test_seqio_evaluator_driven_as_t5x_eval_scores_known_answers(
    qa_model, monkeypatch):
  _register_scored_task()
  # t5x's eval.py: the evaluator, then model loading, then evaluate.
  evaluator = _evaluator(qa_model, SCORED_TASK)
  assert evaluator.model_feature_shapes == {
      'query_token_ids': (16,), 'answer_token_ids': (8, 16), 'targets': (16,)}
  params = _flat_reader(qa_model.params)
  infer = lambda step: functools.partial(_infer_fn(step, batch_size=3),
                                         params=params)
  future, outputs = evaluator.evaluate(
      compute_metrics=True, step=0,
      predict_fn=functools.partial(infer(qa_model.predict_batch),
                                   rng=jax.random.PRNGKey(0)),
      score_fn=infer(qa_model.score_batch),
      predict_with_aux_fn=functools.partial(
          infer(qa_model.predict_batch_with_aux), rng=jax.random.PRNGKey(0)))
  result = future.result()[SCORED_TASK]
  assert result['exact_match'] == 50.0  # 'Zebra' and 'zebra.' match.
  # 'Zebra' and 'stripes' are in the blocks; 'zebra.' and 'giraffe' not.
  assert result['target_found'] == 50.0
  outputs = outputs[SCORED_TASK]
  vocabulary = qa_model.output_vocabulary
  assert [vocabulary.decode(p) for p in
          outputs[ModelOutputType.PREDICTION]] == ['zebra'] * 4
  predictions, aux = outputs[ModelOutputType.PREDICTION_WITH_AUX]
  assert predictions == list(outputs[ModelOutputType.PREDICTION])
  p_answer = np.exp(aux['scores'])
  assert np.all((p_answer > 0) & (p_answer <= 1))
  np.testing.assert_allclose(result['mean_p_answer'], np.mean(p_answer),
                             rtol=1e-6)
  # The first question's target is its prediction: the score of the target
  # (every span of every block) equals the predicted answer's p(y|x) (each
  # block's best span alone), as 'zebra' is each block's one best span.
  scores = np.array(outputs[ModelOutputType.SCORE])
  assert np.isfinite(scores).tolist() == [True, False, False, True]
  np.testing.assert_allclose(scores[0], aux['scores'][0], rtol=1e-5)
  # The host search finds the device search's top k (blocks whose scores
  # differ by rounding may swap: this corpus is nearly all ties).
  query = qa_model.predictor.query([q for q, _ in helpers.NQ_TEST], 16)
  np.testing.assert_array_equal(query['token_ids'], [
      example['query_token_ids'] for _, example in
      evaluator.cached_model_datasets[SCORED_TASK].as_numpy_iterator()])
  retrieval = qa_model.retrieval
  device_scores, device_ids = retrieval.client.search(
      retrieval.query_embeddings(params['retriever'], query),
      len(qa_model.predictor.texts.bodies))
  np.testing.assert_allclose(aux['retrieval_scores'],
                             device_scores[:, :qa_model.num_candidates],
                             rtol=1e-6)
  for scores_k, ids_k, all_scores, all_ids in zip(
      aux['retrieval_scores'], aux['block_ids'], device_scores, device_ids):
    assert len(set(ids_k)) == qa_model.num_candidates
    score_of = dict(zip(all_ids.tolist(), all_scores))
    np.testing.assert_allclose(scores_k, [score_of[i] for i in ids_k],
                               rtol=1e-6)
  # QAPredictor answers in the block's own words; the t5x model decodes
  # wordpieces.
  monkeypatch.setattr(qa_model.predictor, 'params', params)
  assert [r['answers'][0].text for r in qa_model.predictor.predict(query)] == [
      'Zebra'] * 4


@pytest.mark.integration
@pytest.mark.slow
def test_a_task_of_the_users_own_file_is_scored_as_t5x_eval_would(
    qa_model, tmp_path):
  """The same questions from a topics TSV of one's own: `register_qa_file`
  makes a seqio task, which the Evaluator scores as it scores nq_open."""
  path = tmp_path / 'zebra_questions.tsv'
  path.write_text(''.join(f'{q}\t{a!r}\n' for q, a in helpers.NQ_TEST))
  task = open_qa_tasks.register_qa_file(str(path))
  evaluator = _evaluator(qa_model, task)
  future, outputs = evaluator.evaluate(
      compute_metrics=True, step=0,
      predict_fn=functools.partial(_infer_fn(qa_model.predict_batch, 3),
                                   params=_flat_reader(qa_model.params),
                                   rng=jax.random.PRNGKey(0)),
      score_fn=None)
  assert future.result()[task]['exact_match'] == 50.0  # As nq_open's.
  assert [qa_model.output_vocabulary.decode(p) for p in
          outputs[task][ModelOutputType.PREDICTION]] == ['zebra'] * 4


@pytest.mark.integration
@pytest.mark.slow
def test_initial_variables_fit_the_checkpoint_and_name_every_axis(qa_model):
  # eval.py: input shapes from the evaluator's model features, batch first.
  input_shapes = {'query_token_ids': (3, 16), 'answer_token_ids': (3, 8, 16),
                  'targets': (3, 16)}
  variables = jax.eval_shape(functools.partial(
      qa_model.get_initial_variables, input_shapes=input_shapes),
      jax.random.PRNGKey(0))
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
  assert shapes(variables['params']) == shapes(qa_model.params)
  # As t5x validates params_axes: names for every parameter, one per axis.
  params = traverse_util.flatten_dict(variables['params'], sep='/')
  names = traverse_util.flatten_dict(
      flax_partitioning.get_axis_names(variables['params_axes']), sep='/')
  assert set(names) == set(params)
  assert all(len(names[k]) == params[k].ndim for k in params)
  assert tuple(names['reader/bert/embeddings/word_embeddings/embedding']) == (
      'vocab', 'embed')
  # t5x's verify_matching_vocabs: the task's vocabularies.
  features = seqio.get_mixture_or_task('nq_open').output_features
  assert qa_model.input_vocabulary == features['query_token_ids'].vocabulary
  assert qa_model.output_vocabulary == features['targets'].vocabulary


def _model_batch(qa_model, size: int) -> dict:
  """The first `size` nq_open test questions, as model features."""
  dataset = seqio.get_mixture_or_task('nq_open').get_dataset(
      None, split='test', shuffle=False)
  converted = qa_model.FEATURE_CONVERTER_CLS(pack=False)(
      dataset, qa_model.task_feature_lengths)
  return next(converted.batch(size).as_numpy_iterator())


@pytest.mark.integration
@pytest.mark.slow
def test_loss_fn_is_the_finetune_loss(qa_model):
  # Spread scores: with the run's own near-uniform p(z|x) (every score 16.0
  # to within 2e-4) the k-th and (k+1)-th blocks tie to rounding, and the
  # host search inside the jitted loss_fn kept another set than the device
  # search on an AMD EPYC (loss 2.39879 against 2.39830).
  run, params = qa_model.run, _spread_retrieval(qa_model)
  batch = _model_batch(qa_model, 4)
  inputs, _ = qa_model.predictor.preparer.prepare(batch, params,
                                                  qa_model.predictor.step)
  # Deterministic (eval_fn's), with the gradients t5x would train on. Both
  # are sums over the candidates, whatever order they come in.
  (loss, got), grads = jax.jit(jax.value_and_grad(
      qa_model.loss_fn, has_aux=True))(params, batch, None)
  (expected_loss, expected), expected_grads = jax.jit(jax.value_and_grad(
      run.objective.loss, has_aux=True), static_argnums=3)(
          params, inputs, jax.random.PRNGKey(0), True)
  assert float(expected_loss) > 0
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  assert set(got) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(got[name].compute(), value, rtol=1e-5,
                               atol=1e-7)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4,
                                 atol=1e-6), grads, expected_grads)
  np.testing.assert_allclose(
      jax.jit(qa_model.eval_fn)(params, batch)[0], expected_loss, rtol=1e-5)
  # A dropout rng turns dropout on: the loss moves with the key.
  dropout = jax.jit(lambda rng: qa_model.loss_fn(params, batch, rng)[0])
  losses = [float(dropout(jax.random.PRNGKey(seed))) for seed in (1, 1, 2)]
  assert losses[0] == losses[1] != losses[2] and losses[0] != float(loss)


def _spread_retrieval(qa_model):
  """The run's parameters with every question embedded as one vector along
  the direction in which the indexed blocks differ most (the tiny trained
  tower embeds all texts alike, so p(z|x) is near uniform): p(z|x) spreads
  over the candidates, and f(x, z) has no large common part to round."""
  client = qa_model.retrieval.client
  blocks = client.document_embeddings(
      np.arange(client.searcher.num_docs)).astype(np.float64)
  common = blocks.mean(0) / np.linalg.norm(blocks.mean(0))
  spread = blocks - blocks.mean(0)
  spread -= np.outer(spread @ common, common)
  direction = np.linalg.svd(spread)[2][0]
  norm = {'scale': np.zeros_like(direction, np.float32),
          'bias': (12 * direction / np.std(spread @ direction)).astype(
              np.float32)}
  params = qa_model.params
  embedder = {**params['retriever']['embedder'], 'layer_norm': norm}
  return {**params, 'retriever': {**params['retriever'],
                                  'embedder': embedder}}


@pytest.mark.integration
@pytest.mark.slow
def test_score_batch_is_the_marginal_likelihood_of_the_target(qa_model):
  """log sum_z p(z|x) p(y|z,x), computed here from the model's scores and
  span logits over the candidates score_batch retrieved, with the target's
  spans found by scanning the reader's wordpieces."""
  params = _spread_retrieval(qa_model)
  batch = _model_batch(qa_model, 4)
  scores, intermediates = jax.jit(qa_model.score_batch, static_argnums=2)(
      params, batch, True)
  block_ids = np.asarray(intermediates['block_ids'])
  relevance, spans, reader = qa_model.model.apply(
      {'params': params}, token_arrays(batch['query_token_ids']),
      qa_model.retrieval.blocks_of(block_ids),
      qa_model.retrieval.client.document_embeddings(block_ids),
      method='read_spans')
  relevance, spans = (np.asarray(x, np.float64) for x in (relevance, spans))
  token_ids = np.asarray(reader['token_ids'])
  block_mask = np.asarray(reader['block_mask'])
  width = qa_model.model.max_span_width
  expected = []
  for b, target in enumerate(batch['targets']):
    target = [t for t in target if t]
    log_p_z = relevance[b] - np.logaddexp.reduce(relevance[b])
    assert np.exp(log_p_z).max() > 0.5  # Far from uniform (0.2).
    np.testing.assert_allclose(intermediates['log_p_z'][b], log_p_z,
                               rtol=1e-5)
    p_y = 0.0
    for z in range(qa_model.num_candidates):
      inside = set(np.flatnonzero(block_mask[b, z]))
      grid = [(i, w) for i in sorted(inside) for w in range(width)
              if i + w in inside]
      logits = np.array([spans[b, z, i, w] for i, w in grid])
      p_s = np.exp(logits - np.logaddexp.reduce(logits))
      p_y += np.exp(log_p_z[z]) * sum(
          p for (i, w), p in zip(grid, p_s)
          if token_ids[b, z, i:i + w + 1].tolist() == target)
    expected.append(p_y)
  assert 0 < expected[0] < 1 and expected[2] == 0.0  # 'Zebra', 'giraffe'.
  np.testing.assert_allclose(np.exp(scores), expected, rtol=1e-4)
