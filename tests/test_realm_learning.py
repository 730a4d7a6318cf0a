"""REALM's central claim in miniature: the retriever learns from the MLM loss.

A toy corpus of 8 documents `[CLS] key [SEP] value [SEP]` per group, fresh
random keys and values every step, so no value can be memorized: the only way
to predict the masked value of the query `[CLS] key [MASK] [SEP]` is to
retrieve the one document with the same key. As in the paper, the
knowledge-augmented encoder is warm-started (there from BERT; here by reading
the right document alone, which leaves the retriever untouched), and the
retriever starts from scratch with separate towers. Then only the marginal
masked-LM loss trains both, over the null document plus all 8 documents.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from realm_jax.models import losses
from realm_jax.models.bert import BertConfig
from realm_jax.models.realm import Realm

pytestmark = pytest.mark.integration

CLS, SEP, MASK = 2, 3, 4
KEYS, VALUES = np.arange(5, 35), np.arange(35, 64)
DOCS, GROUPS = 8, 4  # 8 documents per group; 4 groups (32 queries) a step.


def _group(rng):
  keys = rng.choice(KEYS, DOCS, replace=False)
  values = rng.choice(VALUES, DOCS, replace=False)
  blocks = np.zeros((DOCS + 1, 6), np.int32)
  blocks[0, :3] = [CLS, SEP, SEP]  # The null document at index 0.
  blocks[1:, :5] = np.stack([np.full(DOCS, CLS), keys, np.full(DOCS, SEP),
                             values, np.full(DOCS, SEP)], axis=1)
  types = np.zeros_like(blocks)
  types[0, 2] = 1
  types[1:, 3:5] = 1
  candidates = {'token_ids': blocks, 'token_type_ids': types,
                'input_mask': (blocks > 0).astype(np.int32)}
  query = np.stack([np.full(DOCS, CLS), keys, np.full(DOCS, MASK),
                    np.full(DOCS, SEP)], axis=1).astype(np.int32)
  return ({'token_ids': query, 'token_type_ids': np.zeros_like(query),
           'input_mask': np.ones_like(query)},
          {k: np.broadcast_to(v, (DOCS,) + v.shape) for k, v in
           candidates.items()},
          values[:, None].astype(np.int32))


def _batch(rng):
  groups = [_group(rng) for _ in range(GROUPS)]
  cat = lambda i: {k: np.concatenate([g[i][k] for g in groups])
                   for k in groups[0][i]}
  return cat(0), cat(1), np.concatenate([g[2] for g in groups])


def _right_document(candidates):
  """Each query's own document only (candidate 1 + its index in the group)."""
  right = np.tile(np.arange(DOCS), GROUPS) + 1
  rows = np.arange(len(right))
  return {k: v[rows, right][:, None] for k, v in candidates.items()}


@pytest.mark.slow
def test_mlm_loss_alone_teaches_the_retriever_to_find_the_document():
  config = BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=16,
                      dropout_rate=0.0, attention_dropout_rate=0.0)
  model = Realm(config, config, projection_size=32, share_towers=False,
                reader_length=8)
  rng = np.random.default_rng(0)
  query, candidates, targets = _batch(rng)
  positions = np.full((len(targets), 1), 2, np.int32)  # The [MASK].
  params = nn.meta.unbox(model.init(jax.random.key(0), query, candidates,
                                    positions))['params']

  def loss_fn(params, query, candidates, targets):
    scores, logits = model.apply({'params': params}, query, candidates,
                                 positions, method='pretrain')
    return losses.realm_mlm_loss(scores, jnp.ones(scores.shape, bool), logits,
                                 targets, jnp.ones_like(targets))

  def trainer(optimizer):
    @jax.jit
    def step(params, state, query, candidates, targets):
      (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, query, candidates, targets)
      updates, state = optimizer.update(grads, state, params)
      return optax.apply_updates(params, updates), state, metrics
    return step

  @jax.jit
  def retrieval_accuracy(params, query, candidates):
    scores = model.apply({'params': params}, query, candidates,
                         method=lambda m, q, c: m.retriever(q, c))
    right = jnp.tile(jnp.arange(DOCS), GROUPS) + 1
    return jnp.mean(jnp.argmax(scores, axis=-1) == right)

  def evaluate(params):
    held_out = np.random.default_rng(123)
    return float(np.mean([retrieval_accuracy(params, *_batch(held_out)[:2])
                          for _ in range(4)]))

  # Warm start of the reader: one candidate, so p(z|x) = 1 and the retriever
  # gets exactly zero gradient.
  optimizer = optax.adam(1e-3)
  step, state, retriever = trainer(optimizer), optimizer.init(params), params[
      'retriever']
  for _ in range(300):
    query, candidates, targets = _batch(rng)
    params, state, metrics = step(params, state, query,
                                  _right_document(candidates), targets)
  assert metrics['masked_token_accuracy'] > 0.95
  jax.tree.map(np.testing.assert_array_equal, params['retriever'], retriever)

  before = evaluate(params)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(
      optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 300, 1e-4)))
  step, state = trainer(optimizer), optimizer.init(params)
  for _ in range(300):
    params, state, metrics = step(params, state, *_batch(rng))
  after = evaluate(params)

  print(f'retrieval accuracy: {before:.3f} before, {after:.3f} after '
        f'(chance {1 / (DOCS + 1):.3f})')
  assert before < 0.25  # Chance is 1/9: the retriever starts knowing nothing.
  assert after > 0.9
  assert metrics['retrieval_utility'] > 1.0  # Retrieval now helps the reader.
