"""BERT's AdamW: the schedule, and decay only where BERT decays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from realm_jax.models.realm import Realm
from realm_jax.training import optimizer

pytestmark = pytest.mark.unit


def test_schedule_warms_up_then_decays_to_zero():
  schedule = optimizer.bert_schedule(1e-4, warmup_steps=10, total_steps=110)
  np.testing.assert_allclose(
      [schedule(s) for s in (0, 5, 10, 60, 110)],
      [0.0, 5e-5, 1e-4, 5e-5, 0.0], atol=1e-12)


def test_schedule_rejects_warmup_past_the_end():
  with pytest.raises(ValueError, match='warmup_steps=10'):
    optimizer.bert_schedule(1e-4, warmup_steps=10, total_steps=10)
  with pytest.raises(ValueError, match='warmup_steps=1'):
    optimizer.bert_schedule(1e-4, warmup_steps=1, total_steps=0)


def test_no_decay_on_layer_norms_and_biases(tiny_config):
  ones = lambda *s: {k: jnp.ones(s, jnp.int32) for k in (
      'token_ids', 'input_mask', 'token_type_ids')}
  init = jax.jit(Realm(tiny_config, tiny_config, reader_length=12).init)
  params = nn.meta.unbox(init(jax.random.key(0), ones(1, 4), ones(1, 2, 6),
                              jnp.ones((1, 1), jnp.int32)))['params']
  mask = optimizer.decay_mask(params)
  flat = {jax.tree_util.keystr(p): m for p, m in
          jax.tree_util.tree_leaves_with_path(mask)}
  assert flat["['reader']['bert']['embeddings']['word_embeddings']['embedding']"]
  # The stacked layers' kernels decay, their biases and LayerNorms do not.
  assert flat["['reader']['bert']['layers']['attention']['query']['kernel']"]
  assert not flat["['reader']['bert']['layers']['attention']['query']['bias']"]
  assert not flat["['reader']['bert']['layers']['output_layer_norm']['scale']"]
  assert not flat["['reader']['bert']['embeddings']['layer_norm']['scale']"]
  assert not flat["['reader']['mlm_head']['output_bias']"]
  assert not flat["['retriever']['embedder']['layer_norm']['bias']"]

  # With zero gradients only decoupled weight decay moves a parameter.
  tx, _ = optimizer.bert_adamw(learning_rate=0.1, warmup_steps=0,
                               total_steps=10, weight_decay=0.5)
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params),
                                  tx.init(params), params)
  for (path, update), decayed in zip(jax.tree_util.tree_leaves_with_path(
      updates), jax.tree.leaves(mask)):
    value = params
    for key in path:
      value = value[key.key]
    expected = -0.1 * 0.5 * value if decayed else jnp.zeros_like(value)
    np.testing.assert_allclose(update, expected, rtol=1e-6, atol=1e-9,
                               err_msg=jax.tree_util.keystr(path))


def test_frozen_parameters_never_move(tiny_config):
  params = {'query': jnp.ones((2, 2)), 'document': jnp.ones((2, 2))}
  tx, _ = optimizer.bert_adamw(
      learning_rate=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5,
      frozen=lambda p: {'query': False, 'document': True})
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  assert np.all(np.asarray(updates['document']) == 0)
  assert np.all(np.asarray(updates['query']) < 0)


def test_the_retriever_can_learn_slower_than_the_reader():
  params = {'retriever': {'kernel': jnp.ones((2, 2))},
            'reader': {'kernel': jnp.ones((2, 2))}}
  grads = jax.tree.map(jnp.ones_like, params)
  make = lambda scale: optimizer.bert_adamw(
      learning_rate=0.1, warmup_steps=0, total_steps=10,
      retriever_learning_rate_scale=scale)[0]
  full, slow = make(1.0), make(0.1)
  full_updates, _ = full.update(grads, full.init(params), params)
  slow_updates, _ = slow.update(grads, slow.init(params), params)
  np.testing.assert_allclose(slow_updates['retriever']['kernel'],
                             0.1 * np.asarray(full_updates['retriever']
                                              ['kernel']), rtol=1e-6)
  np.testing.assert_array_equal(slow_updates['reader']['kernel'],
                                full_updates['reader']['kernel'])
  # ICT's runs have no reader: their retriever is the model, left alone.
  ict = {'retriever': params['retriever']}
  ict_grads = {'retriever': grads['retriever']}
  ict_slow, _ = slow.update(ict_grads, slow.init(ict), ict)
  ict_full, _ = full.update(ict_grads, full.init(ict), ict)
  np.testing.assert_array_equal(ict_slow['retriever']['kernel'],
                                ict_full['retriever']['kernel'])


def test_the_retriever_can_wait_for_the_reader():
  params = {'retriever': {'kernel': jnp.ones((2, 2))},
            'reader': {'kernel': jnp.ones((2, 2))}}
  grads = jax.tree.map(jnp.ones_like, params)
  tx = optimizer.bert_adamw(learning_rate=0.1, warmup_steps=0,
                            total_steps=10, retriever_frozen_steps=2)[0]
  state = tx.init(params)
  moved = []
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    moved.append((bool(np.any(np.asarray(updates['retriever']['kernel']))),
                  bool(np.all(np.asarray(updates['reader']['kernel']) < 0))))
  # Steps 0 and 1 train the reader alone; step 2 trains both.
  assert moved == [(False, True), (False, True), (True, True)]
