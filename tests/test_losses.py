"""REALM's objectives against their equations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from realm_jax.models import losses

pytestmark = pytest.mark.unit


def _random_inputs(rng, batch=4, k=6, tokens=3, vocab=11):
  scores = rng.standard_normal((batch, k))
  candidate_mask = rng.random((batch, k)) < 0.7
  candidate_mask[:, 0] = True  # The null document.
  mlm_logits = rng.standard_normal((batch, k, tokens, vocab))
  targets = rng.integers(0, vocab, (batch, tokens))
  target_mask = np.ones((batch, tokens), bool)
  target_mask[0, 1:] = False
  return scores, candidate_mask, mlm_logits, targets, target_mask


def _log_softmax(x, axis=-1):
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_retriever_gradient_is_retrieval_utility_weighted(seed):
  """d log p(y|x) / d f(x,z) = r(z) = [p(y|z,x) / p(y|x) - 1] p(z|x)."""
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True):
    scores, mask, _, _, _ = _random_inputs(rng)
    log_p_y_given_z = -3 * rng.random((4, 6, 1))  # One target: y.
    target_mask = np.ones((4, 1), bool)

    def log_p_y(f):
      log_p_z = losses.candidate_log_probs(f, mask)
      return jnp.sum(losses.marginal_log_likelihood(
          log_p_z, log_p_y_given_z, target_mask, 'whole_span'))

    gradient = np.asarray(jax.grad(log_p_y)(jnp.asarray(scores)))
  p_z = np.where(mask, np.exp(_log_softmax(np.where(mask, scores, -np.inf))), 0)
  p_y_given_z = np.exp(log_p_y_given_z[..., 0])
  p_y = np.sum(p_z * p_y_given_z, axis=1, keepdims=True)
  expected = (p_y_given_z / p_y - 1) * p_z
  np.testing.assert_allclose(gradient, expected, atol=1e-6)
  assert np.all(gradient[~mask] == 0)


def test_per_token_gradient_sums_the_per_token_utilities():
  rng = np.random.default_rng(3)
  with jax.enable_x64(True):
    scores, mask, _, _, _ = _random_inputs(rng)
    log_p_y_given_z = -3 * rng.random((4, 6, 3))
    target_mask = np.ones((4, 3), bool)
    gradient = np.asarray(jax.grad(lambda f: jnp.sum(
        losses.marginal_log_likelihood(
            losses.candidate_log_probs(f, mask), log_p_y_given_z, target_mask,
            'per_token')))(jnp.asarray(scores)))
  p_z = np.where(mask, np.exp(_log_softmax(np.where(mask, scores, -np.inf))), 0)
  p_y_given_z = np.exp(log_p_y_given_z)  # [b, k, j]
  p_y = np.sum(p_z[..., None] * p_y_given_z, axis=1, keepdims=True)
  expected = np.sum((p_y_given_z / p_y - 1) * p_z[..., None], axis=-1)
  np.testing.assert_allclose(gradient, expected, atol=1e-6)


@pytest.mark.parametrize('marginalize', ['per_token', 'whole_span'])
def test_masked_candidates_get_zero_probability_and_gradient(marginalize):
  scores, mask, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(4))
  scores, logits = np.float32(scores), np.float32(logits)

  def loss(scores, logits):
    return losses.realm_mlm_loss(scores, mask, logits, targets, target_mask,
                                 marginalize)[0]

  p_z = np.exp(losses.candidate_log_probs(scores, mask))
  assert np.all(p_z[~mask] == 0) and np.allclose(p_z.sum(-1), 1)
  score_grad, logit_grad = jax.grad(loss, argnums=(0, 1))(scores, logits)
  assert np.all(np.isfinite(score_grad)) and np.all(np.isfinite(logit_grad))
  assert np.all(np.asarray(score_grad)[~mask] == 0)
  assert np.all(np.asarray(logit_grad)[~mask] == 0)
  assert np.any(np.asarray(logit_grad)[mask] != 0)


def test_only_the_null_document_left():
  """Retrieval returned nothing: p(null|x) = 1 and the loss is the reader's."""
  scores, _, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(5))
  mask = np.zeros_like(target_mask, shape=scores.shape)
  mask[:, 0] = True
  loss, metrics = losses.realm_mlm_loss(scores, mask, logits, targets,
                                        target_mask)
  log_p = _log_softmax(logits[:, 0])
  reader_only = -np.sum(np.take_along_axis(log_p, targets[..., None], -1)[
      ..., 0] * target_mask) / target_mask.sum()
  np.testing.assert_allclose(loss, reader_only, rtol=1e-5)
  np.testing.assert_allclose(metrics['null_document_prob'], 1.0)
  np.testing.assert_allclose(metrics['retrieval_utility'], 0.0, atol=1e-6)
  np.testing.assert_allclose(metrics['retrieval_entropy'], 0.0, atol=1e-6)



def test_null_score_below_best_sits_offset_under_the_best_valid_block():
  scores = np.array([[-90., 3., 7., 50.], [-90., 1., 2., 3.],
                     [-90., 4., 5., 6.]], np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
  got = losses.null_score_below_best(scores, mask, 2.0)
  # The masked 50 does not count; a query with no block keeps its score.
  np.testing.assert_allclose(got[:, 0], [5., 1., -90.])
  np.testing.assert_array_equal(got[:, 1:], scores[:, 1:])
  # The blocks' gradient is their own columns' alone: the same as when the
  # null column is a constant.
  weights = np.arange(12, dtype=np.float32).reshape(3, 4)
  grad = jax.grad(lambda s: jnp.sum(jax.nn.log_softmax(
      losses.null_score_below_best(s, mask, 2.0)) * weights))(scores)
  constant = np.asarray(got[:, :1])
  expected = jax.grad(lambda s: jnp.sum(jax.nn.log_softmax(
      jnp.concatenate([constant, s[:, 1:]], axis=1)) * weights))(scores)
  np.testing.assert_allclose(grad[:, 1:], expected[:, 1:], rtol=1e-6)
  np.testing.assert_array_equal(grad[:2, 0], 0.)

def test_marginalizations_agree_on_one_token_and_differ_on_more():
  scores, mask, logits, targets, _ = _random_inputs(np.random.default_rng(6))
  one = np.zeros(targets.shape, bool)
  one[:, 1] = True
  loss = lambda m, how: losses.realm_mlm_loss(scores, mask, logits, targets, m,
                                              how)[0]
  np.testing.assert_allclose(loss(one, 'per_token'), loss(one, 'whole_span'),
                             rtol=1e-6)
  every = np.ones(targets.shape, bool)
  assert abs(loss(every, 'per_token') - loss(every, 'whole_span')) > 1e-3
  # Jensen: the per-token marginal never has the lower likelihood.
  assert loss(every, 'per_token') <= loss(every, 'whole_span')


def test_mlm_metrics_match_their_definitions():
  scores, mask, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(7))
  _, metrics = losses.realm_mlm_loss(scores, mask, logits, targets,
                                     target_mask, 'whole_span')
  p_z = np.where(mask, np.exp(_log_softmax(np.where(mask, scores, -np.inf))), 0)
  p_vocab = np.exp(_log_softmax(logits))  # [b, k, j, v]
  p_targets = np.take_along_axis(p_vocab, targets[:, None, :, None], -1)[..., 0]
  p_targets = np.where(target_mask[:, None], p_targets, 1.0)
  p_y = np.sum(p_z * p_targets.prod(-1), axis=1)
  p_y_null = p_targets[:, 0].prod(-1)
  tokens = target_mask.sum()
  np.testing.assert_allclose(metrics['marginal_log_likelihood'],
                             np.log(p_y).sum() / tokens, rtol=1e-5)
  np.testing.assert_allclose(metrics['retrieval_utility'],
                             np.sum(np.log(p_y) - np.log(p_y_null)) / tokens,
                             rtol=1e-5)
  marginal = np.einsum('bk,bkjv->bjv', p_z, p_vocab)
  correct = (marginal.argmax(-1) == targets) & target_mask
  np.testing.assert_allclose(metrics['masked_token_accuracy'],
                             correct.sum() / tokens)
  entropy = -np.sum(np.where(p_z > 0, p_z * np.log(np.where(p_z > 0, p_z, 1)),
                             0), axis=1)
  np.testing.assert_allclose(metrics['retrieval_entropy'], entropy.mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(metrics['retrieval_max_prob'],
                             p_z.max(1).mean(), rtol=1e-6)


def test_per_example_terms_are_what_the_batch_metrics_sum():
  """The held-out evaluation resamples queries: each query's terms must be
  its own, and their sums the batch metrics."""
  scores, mask, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(8))
  terms = losses.realm_mlm_per_example(scores, mask, logits, targets,
                                       target_mask)
  _, metrics = losses.realm_mlm_loss(scores, mask, logits, targets,
                                     target_mask)
  np.testing.assert_array_equal(terms['masked_tokens'], target_mask.sum(-1))
  tokens = target_mask.sum()
  np.testing.assert_allclose(np.sum(terms['correct_tokens']) / tokens,
                             metrics['masked_token_accuracy'])
  np.testing.assert_allclose(np.sum(terms['log_likelihood']) / tokens,
                             metrics['marginal_log_likelihood'], rtol=1e-6)
  np.testing.assert_allclose(
      np.sum(terms['log_likelihood'] - terms['null_log_likelihood']) / tokens,
      metrics['retrieval_utility'], rtol=1e-5)
  # The null document read alone: candidate 0's own argmax.
  null_correct = (np.argmax(logits[:, 0], -1) == targets) & (target_mask > 0)
  np.testing.assert_array_equal(terms['null_correct_tokens'],
                                null_correct.sum(-1))
  # Query 0's terms do not depend on query 1's inputs.
  shifted = scores.copy()
  shifted[1] += np.arange(scores.shape[1])
  changed = losses.realm_mlm_per_example(shifted, mask, logits, targets,
                                         target_mask)
  assert changed['log_likelihood'][1] != terms['log_likelihood'][1]
  np.testing.assert_allclose(changed['log_likelihood'][0],
                             terms['log_likelihood'][0], rtol=1e-6)


def test_unknown_marginalization_is_an_error():
  with pytest.raises(ValueError, match='marginalize'):
    losses.marginal_log_likelihood(jnp.zeros((1, 2)), jnp.zeros((1, 2, 1)),
                                   jnp.ones((1, 1)), 'per_document')


def _qa_example():
  """2 candidates, 3 positions, spans of width <= 2."""
  scores = np.array([[0.5, -1.0]], np.float32)
  candidate_mask = np.array([[True, True]])
  span_logits = np.arange(12, dtype=np.float32).reshape(1, 2, 3, 2) / 4
  span_mask = np.ones((1, 2, 3, 2), bool)
  span_mask[:, :, 2, 1] = False  # Would run past the end.
  gold = np.zeros((1, 2, 3, 2), bool)
  gold[0, 0, 1, 0] = gold[0, 1, 0, 1] = True
  return scores, candidate_mask, span_logits, span_mask, gold


def test_qa_loss_equals_the_hand_computed_value():
  scores, candidate_mask, span_logits, span_mask, gold = _qa_example()
  loss, metrics = losses.qa_loss(scores, candidate_mask, span_logits,
                                 span_mask, gold)
  # Joint scores S(z, s) + f(x, z); valid spans are all but (i=2, w=1).
  z0 = [0.0, 0.25, 0.5, 0.75, 1.0] + np.float32(0.5)
  z1 = [1.5, 1.75, 2.0, 2.25, 2.5] + np.float32(-1.0)
  normalizer = np.log(np.sum(np.exp(z0)) + np.sum(np.exp(z1)))
  # Gold: candidate 0 span (1, +0) -> logit 0.5; candidate 1 span (0, +1) -> 1.75.
  reader = -(np.log(np.exp(0.5 + 0.5) + np.exp(1.75 - 1.0)) - normalizer)
  retriever = 0.0  # Both candidates hold an answer: log sum p(z|x) = log 1.
  np.testing.assert_allclose(metrics['reader_loss'], reader, rtol=1e-6)
  np.testing.assert_allclose(metrics['retriever_loss'], retriever, atol=1e-6)
  np.testing.assert_allclose(loss, reader + retriever, rtol=1e-6)

  gold[0, 1] = False  # Only candidate 0 holds an answer now.
  _, metrics = losses.qa_loss(scores, candidate_mask, span_logits, span_mask,
                              gold)
  np.testing.assert_allclose(metrics['retriever_loss'],
                             -np.log(1 / (1 + np.exp(-1.5))), rtol=1e-6)


def test_qa_loss_with_orqas_beam_marginalizes_the_retriever_over_it():
  scores, candidate_mask, span_logits, span_mask, gold = _qa_example()
  gold[0, 1] = False  # Of the 2 read, candidate 0 holds an answer.
  # A beam of 4: the 2 read first, then 2 scored but not read; the 4th
  # holds an answer too, the 3rd is padding.
  f = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
  mask = np.array([[True, True, False, True]])
  held = np.array([[True, False, True, True]])
  loss_of = lambda f: losses.qa_loss(f[:, :2], candidate_mask, span_logits,
                                     span_mask, gold, (f, mask, held))
  loss, metrics = loss_of(f)
  _, read_only = losses.qa_loss(scores, candidate_mask, span_logits,
                                span_mask, gold)
  p = np.exp([0.5, -1.0, 0.25]) / np.sum(np.exp([0.5, -1.0, 0.25]))
  np.testing.assert_allclose(metrics['retriever_loss'], -np.log(p[0] + p[2]),
                             rtol=1e-6)
  np.testing.assert_allclose(metrics['reader_loss'], read_only['reader_loss'],
                             rtol=1e-6)
  assert metrics['beam_answer_recall'] == 1 and 'beam_answer_recall' not in (
      read_only)
  # d/df: p(z|x) - p(z|x, an answer in z), 0 on padding (the reader's
  # share reaches the 2 read only).
  reader_grad = jax.grad(lambda s: losses.qa_loss(
      s, candidate_mask, span_logits, span_mask, gold)[1]['reader_loss'])(
          scores)
  posterior = np.array([p[0], 0, p[2]]) / (p[0] + p[2])
  expected = np.zeros(4)
  expected[[0, 1, 3]] = p - posterior
  expected[:2] += np.asarray(reader_grad)[0]
  np.testing.assert_allclose(jax.grad(lambda f: loss_of(f)[0])(f)[0],
                             expected, rtol=1e-5, atol=1e-6)
  # No block of the beam holds an answer: no retriever term.
  _, metrics = losses.qa_loss(scores, candidate_mask, span_logits, span_mask,
                              gold, (f, mask, np.zeros_like(held)))
  assert metrics['retriever_loss'] == 0 and metrics['beam_answer_recall'] == 0


def test_qa_loss_is_zero_and_finite_without_an_answer():
  scores, candidate_mask, span_logits, span_mask, gold = _qa_example()
  no_gold = np.zeros_like(gold)
  both = lambda s, l: losses.qa_loss(s, candidate_mask, l, span_mask,
                                     np.stack([gold[0], no_gold[0]]))[0]
  stacked = (np.concatenate([scores, scores]),
             np.concatenate([span_logits, span_logits]))
  loss, metrics = losses.qa_loss(scores, candidate_mask, span_logits,
                                 span_mask, no_gold)
  assert loss == 0 and metrics['answer_recall'] == 0
  candidate_mask = np.concatenate([candidate_mask, candidate_mask])
  span_mask = np.concatenate([span_mask, span_mask])
  grads = jax.grad(both, argnums=(0, 1))(*stacked)
  assert all(np.all(np.isfinite(g)) for g in grads)
  # The example without an answer contributes nothing.
  assert np.all(np.asarray(grads[0])[1] == 0) and np.all(
      np.asarray(grads[1])[1] == 0)


def _ict_reference(queries, blocks):
  logits = queries @ blocks.T
  return -np.mean(np.diag(_log_softmax(logits)))


def test_ict_loss_matches_numpy():
  rng = np.random.default_rng(8)
  queries, blocks = rng.standard_normal((2, 8, 5)).astype(np.float32)
  loss, metrics = losses.ict_loss(queries, blocks)
  np.testing.assert_allclose(loss, _ict_reference(queries, blocks), rtol=1e-5)
  np.testing.assert_allclose(
      metrics['accuracy'],
      np.mean((queries @ blocks.T).argmax(1) == np.arange(8)))


def test_ict_loss_is_the_same_on_one_and_four_devices():
  rng = np.random.default_rng(9)
  queries, blocks = rng.standard_normal((2, 8, 5)).astype(np.float32)
  single, _ = losses.ict_loss(queries, blocks)
  # Auto axes: the GSPMD partitioner decides the collectives (as in training).
  mesh = jax.make_mesh((4,), ('data',), (jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  data = NamedSharding(mesh, P('data'))
  queries, blocks = jax.device_put((queries, blocks), data)

  # shard_map: each device holds 2 queries, and gathers all 8 blocks.
  sharded = jax.jit(jax.shard_map(
      functools.partial(losses.ict_loss, axis_name='data'), mesh=mesh,
      in_specs=(P('data'), P('data')), out_specs=P()))
  mapped, mapped_metrics = sharded(queries, blocks)
  # jit over batch-sharded arrays: XLA inserts the gather.
  jitted, _ = jax.jit(losses.ict_loss)(queries, blocks)
  queries, blocks = np.asarray(queries), np.asarray(blocks)
  np.testing.assert_allclose(mapped, single, rtol=1e-6)
  np.testing.assert_allclose(jitted, single, rtol=1e-6)
  np.testing.assert_allclose(mapped, _ict_reference(queries, blocks), rtol=1e-5)
  assert 0 <= mapped_metrics['accuracy'] <= 1


# The successors' retriever signals (losses.RetrieverSignal).

SUCCESSORS = ('emdr2', 'pdist')


def _p_z(scores, mask):
  return np.where(mask, np.exp(_log_softmax(np.where(mask, scores, -np.inf))),
                  0)


def _log_p_y_given_z(logits, targets):
  """log p(y_j|z,x) [b, k, M] in numpy."""
  return np.take_along_axis(_log_softmax(logits), targets[:, None, :, None],
                            -1)[..., 0]


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('marginalize', ['per_token', 'whole_span'])
def test_emdr2_retriever_gradient_is_posterior_minus_prior(seed, marginalize):
  """d/df of -log sum_z p(z|x) sg(p(y|z,x)) is p(z|x) - p(z|x,y): REALM's
  -r(z), per masked token (per_token) or per span (whole_span)."""
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True):
    scores, mask, logits, targets, target_mask = _random_inputs(rng)
    loss = lambda f: losses.realm_mlm_loss(f, mask, logits, targets,
                                           target_mask, marginalize,
                                           'emdr2')[0]
    gradient = np.asarray(jax.grad(loss)(jnp.asarray(scores)))
  p_z = _p_z(scores, mask)
  log_p = np.where(target_mask[:, None, :], _log_p_y_given_z(logits, targets),
                   0.0)
  if marginalize == 'whole_span':
    log_p = np.sum(log_p, axis=-1, keepdims=True)
  joint = p_z[..., None] * np.exp(log_p)
  posterior = joint / joint.sum(axis=1, keepdims=True)
  live = target_mask if marginalize == 'per_token' else np.ones((4, 1), bool)
  expected = np.sum((p_z[..., None] - posterior) * live[:, None, :], axis=-1)
  # The reader's logits are taken in float32 (`_token_log_probs`).
  np.testing.assert_allclose(gradient, expected / target_mask.sum(),
                             atol=1e-7)


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('temperature', [0.01, 1.0])
def test_pdist_retriever_gradient_is_prior_minus_the_readers_softmax(
    seed, temperature):
  """d/df of KL(q || p(z|x)) is p(z|x) - q(z), q the softmax of the mean
  log p(y_j|z,x) over the masked tokens, at the temperature."""
  rng = np.random.default_rng(seed)
  with jax.enable_x64(True):
    scores, mask, logits, targets, target_mask = _random_inputs(rng)
    loss, metrics = losses.realm_mlm_loss(scores, mask, logits, targets,
                                          target_mask, signal='pdist',
                                          signal_temperature=temperature)
    gradient = np.asarray(jax.grad(lambda f: losses.realm_mlm_loss(
        f, mask, logits, targets, target_mask, signal='pdist',
        signal_temperature=temperature)[0])(jnp.asarray(scores)))
  p_z = _p_z(scores, mask)
  mean_ll = np.sum(_log_p_y_given_z(logits, targets) * target_mask[:, None],
                   axis=-1) / target_mask.sum(-1, keepdims=True)
  q = _p_z(mean_ll / temperature, mask)
  np.testing.assert_allclose(gradient, (p_z - q) / len(scores), atol=1e-6)
  kl = np.sum(np.where(mask, q * (np.log(np.where(mask, q, 1))
                                  - np.log(np.where(mask, p_z, 1))), 0), -1)
  np.testing.assert_allclose(metrics['retriever_loss'], kl.mean(), rtol=1e-5)
  assert np.all(gradient[~mask] == 0)


@pytest.mark.parametrize('signal', SUCCESSORS)
@pytest.mark.parametrize('marginalize', ['per_token', 'whole_span'])
def test_the_successors_reader_learns_as_realms_does(signal, marginalize):
  """The reader's term, -log sum_z sg(p(z|x)) p(y|z,x), gives the logits
  REALM's gradient; the retriever's term sends them nothing. So emdr2's
  gradient is the marginal's, to the scores too: with a reader that reads
  each block apart the two are one objective."""
  rng = np.random.default_rng(6)
  scores, mask, logits, targets, target_mask = _random_inputs(rng)
  with jax.enable_x64(True):
    grads = lambda how: [np.asarray(g) for g in jax.grad(
        lambda f, l: losses.realm_mlm_loss(f, mask, l, targets, target_mask,
                                           marginalize, how)[0],
        argnums=(0, 1))(jnp.asarray(scores), jnp.asarray(logits))]
    (realm_scores, realm_logits), (successor_scores, successor_logits) = (
        grads('marginal'), grads(signal))
    loss, metrics = losses.realm_mlm_loss(scores, mask, logits, targets,
                                          target_mask, marginalize,
                                          signal=signal)
    _, marginal = losses.realm_mlm_loss(scores, mask, logits, targets,
                                        target_mask, marginalize)
  np.testing.assert_allclose(successor_logits, realm_logits, atol=1e-7)
  if signal == 'emdr2':
    np.testing.assert_allclose(successor_scores, realm_scores, atol=1e-7)
  # The reader's term is the marginal's value; the total adds the
  # retriever's term.
  np.testing.assert_allclose(metrics['reader_loss'], marginal['loss'],
                             rtol=1e-6)
  np.testing.assert_allclose(loss, metrics['reader_loss']
                             + metrics['retriever_loss'], rtol=1e-9)
  # The held-out figures are the marginal's, whatever trains the retriever.
  for name in ('marginal_log_likelihood', 'masked_token_accuracy',
               'retrieval_utility'):
    np.testing.assert_allclose(metrics[name], marginal[name], rtol=1e-6)


@pytest.mark.parametrize('signal', SUCCESSORS)
def test_the_successors_are_finite_with_masked_candidates_and_masks(signal):
  scores, mask, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(7))
  mask[1, 1:] = False  # The null document alone.
  target_mask[2] = False  # No masked token at all.
  scores, logits = np.float32(scores), np.float32(logits)
  loss = lambda s, l: losses.realm_mlm_loss(s, mask, l, targets, target_mask,
                                            signal=signal)[0]
  score_grad, logit_grad = map(np.asarray, jax.grad(loss, argnums=(0, 1))(
      scores, logits))
  assert np.isfinite(loss(scores, logits))
  assert np.all(np.isfinite(score_grad)) and np.all(np.isfinite(logit_grad))
  assert np.all(score_grad[~mask] == 0) and np.all(logit_grad[~mask] == 0)
  assert np.all(score_grad[1] == 0)  # One candidate: p(z|x) = 1.
  assert np.all(score_grad[2] == 0) and np.all(logit_grad[2] == 0)


def test_distillation_kl_is_zero_where_no_candidate_is_valid():
  log_p_z = jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]]))
  valid = np.array([[False, False], [True, True]])
  kl = losses.distillation_kl(log_p_z, jnp.array([[3., 1.], [0., 0.]]), valid,
                              1.0)
  np.testing.assert_allclose(kl, [0.0, 0.5 * np.log(2) + 0.5 * np.log(2 / 3)],
                             rtol=1e-6)
  grad = jax.grad(lambda l: jnp.sum(losses.distillation_kl(
      l, jnp.zeros((2, 2)), valid, 1.0)))(log_p_z)
  assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[0] == 0)


def test_an_unknown_signal_or_temperature_is_refused_by_name():
  inputs = _random_inputs(np.random.default_rng(8))
  with pytest.raises(ValueError, match=r"retriever_signal.name='realm'"):
    losses.realm_mlm_loss(*inputs, signal='realm')
  with pytest.raises(ValueError, match='retriever_signal.temperature=0'):
    losses.realm_mlm_loss(*inputs, signal='pdist', signal_temperature=0)


def _qa_block_log_likelihoods(span_logits, span_mask, gold):
  """log p(y|z,x) of each block in numpy: its gold spans' share of its own."""
  exp = np.exp(span_logits)
  return np.log(np.sum(exp * gold, axis=(2, 3))
                / np.sum(exp * span_mask, axis=(2, 3)))


@pytest.mark.parametrize('signal', SUCCESSORS)
def test_qa_successor_gradients_to_the_scores_are_analytic(signal):
  scores, candidate_mask, span_logits, span_mask, gold = _qa_example()
  scores = np.array([[0.5, -1.0]])
  with jax.enable_x64(True):
    loss_of = lambda f: losses.qa_loss(f, candidate_mask, span_logits,
                                       span_mask, gold, signal=signal,
                                       signal_temperature=0.5)
    loss, metrics = loss_of(scores)
    gradient = np.asarray(jax.grad(lambda f: loss_of(f)[0])(scores))
  p = np.exp(scores) / np.exp(scores).sum()
  block_ll = _qa_block_log_likelihoods(span_logits, span_mask, gold)
  if signal == 'emdr2':
    target = p * np.exp(block_ll) / np.sum(p * np.exp(block_ll))
    np.testing.assert_allclose(metrics['retriever_loss'],
                               -np.log(np.sum(p * np.exp(block_ll))),
                               rtol=1e-6)
  else:
    target = np.exp(block_ll / 0.5) / np.exp(block_ll / 0.5).sum()
    np.testing.assert_allclose(metrics['retriever_loss'],
                               np.sum(target * np.log(target / p)), rtol=1e-5)
  # The reader's term holds f fixed: all of d/df is the retriever's (the
  # span scores are taken in float32).
  np.testing.assert_allclose(gradient, p - target, atol=1e-7)
  _, orqa = losses.qa_loss(scores, candidate_mask, span_logits, span_mask,
                           gold)
  np.testing.assert_allclose(metrics['reader_loss'], orqa['reader_loss'],
                             rtol=1e-6)
  # No block holds an answer: no retriever term, no gradient.
  none = lambda f: losses.qa_loss(f, candidate_mask, span_logits, span_mask,
                                  np.zeros_like(gold), signal=signal)[0]
  assert none(scores) == 0 and np.all(jax.grad(none)(scores) == 0)


def test_qa_successors_refuse_orqas_beam():
  scores, candidate_mask, span_logits, span_mask, gold = _qa_example()
  beam = (scores, candidate_mask, np.ones_like(candidate_mask))
  with pytest.raises(ValueError, match='retriever beam'):
    losses.qa_loss(scores, candidate_mask, span_logits, span_mask, gold, beam,
                   signal='pdist')


@pytest.mark.parametrize('signal', losses.RETRIEVER_SIGNALS)
def test_each_signal_is_the_same_on_one_and_four_devices(signal):
  """jit over batch-sharded arrays (GSPMD, as training shards a batch)
  gives the loss and the score gradient of one device."""
  scores, mask, logits, targets, target_mask = _random_inputs(
      np.random.default_rng(10), batch=8)
  scores, logits = np.float32(scores), np.float32(logits)
  loss = lambda f, l, m, t, tm: losses.realm_mlm_loss(f, m, l, t, tm,
                                                      signal=signal)[0]
  value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  single = value_and_grad(scores, logits, mask, targets, target_mask)
  mesh = jax.make_mesh((4,), ('data',), (jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  sharded_inputs = jax.device_put(
      (scores, logits, mask, targets, target_mask),
      NamedSharding(mesh, P('data')))
  sharded = value_and_grad(*sharded_inputs)
  assert sharded[1][0].sharding.spec[0] == 'data'
  np.testing.assert_allclose(sharded[0], single[0], rtol=1e-6)
  for got, want in zip(sharded[1], single[1]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
