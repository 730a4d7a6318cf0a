"""REALM's central claim in miniature: the retriever learns from the MLM loss.

A toy corpus of 8 documents `[CLS] key [SEP] value [SEP]` per group, fresh
random keys and values every step, so no value can be memorized: the only way
to predict the masked value of the query `[CLS] key [MASK] [SEP]` is to
retrieve the one document with the same key. As in the paper, the
knowledge-augmented encoder is warm-started (there from BERT; here by reading
the right document alone, which leaves the retriever untouched), and the
retriever starts from scratch with separate towers. Then only the masked-LM
loss trains both, over the null document plus all 8 documents: REALM's
marginal likelihood, or a successor's retriever signal (EMDR2, perplexity
distillation). The same run with the retriever frozen is the control.
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


CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=64, max_position_embeddings=16,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
MODEL = Realm(CONFIG, CONFIG, projection_size=32, share_towers=False,
              reader_length=8)
POSITIONS = np.full((DOCS * GROUPS, 1), 2, np.int32)  # The [MASK].


def _trainer(optimizer, signal, train_retriever=True):
  """A jitted step of `signal`'s loss; the retriever's update is dropped
  where it must not train."""
  def loss_fn(params, query, candidates, targets):
    scores, logits = MODEL.apply({'params': params}, query, candidates,
                                 POSITIONS, method='pretrain')
    return losses.realm_mlm_loss(scores, jnp.ones(scores.shape, bool), logits,
                                 targets, jnp.ones_like(targets),
                                 signal=signal)

  @jax.jit
  def step(params, state, query, candidates, targets):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, query, candidates, targets)
    if not train_retriever:
      grads['retriever'] = jax.tree.map(jnp.zeros_like, grads['retriever'])
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, metrics
  return step


@jax.jit
def _retrieval_accuracy(params, query, candidates):
  scores = MODEL.apply({'params': params}, query, candidates,
                       method=lambda m, q, c: m.retriever(q, c))
  right = jnp.tile(jnp.arange(DOCS), GROUPS) + 1
  return jnp.mean(jnp.argmax(scores, axis=-1) == right)


def _held_out_retrieval_accuracy(params):
  held_out = np.random.default_rng(123)
  return float(np.mean([_retrieval_accuracy(params, *_batch(held_out)[:2])
                        for _ in range(4)]))


@pytest.fixture(scope='module')
def warm_reader():
  """Parameters whose reader fills a value from the right document (read
  alone: one candidate, so p(z|x) = 1 and the retriever gets exactly zero
  gradient), and whose retriever is still random."""
  rng = np.random.default_rng(0)
  query, candidates, _ = _batch(rng)
  params = nn.meta.unbox(MODEL.init(jax.random.key(0), query, candidates,
                                    POSITIONS))['params']
  optimizer = optax.adam(1e-3)
  step, state, retriever = (_trainer(optimizer, 'marginal'),
                            optimizer.init(params), params['retriever'])
  for _ in range(300):
    query, candidates, targets = _batch(rng)
    params, state, metrics = step(params, state, query,
                                  _right_document(candidates), targets)
  assert metrics['masked_token_accuracy'] > 0.95
  jax.tree.map(np.testing.assert_array_equal, params['retriever'], retriever)
  before = _held_out_retrieval_accuracy(params)
  assert before < 0.25  # Chance is 1/9: the retriever starts knowing nothing.
  return params


def _pretrain(params, signal, train_retriever):
  """300 steps of REALM over the null document and all 8 documents:
  (held-out retrieval accuracy, the last step's metrics)."""
  rng = np.random.default_rng(1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(
      optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 300, 1e-4)))
  step, state = (_trainer(optimizer, signal, train_retriever),
                 optimizer.init(params))
  for _ in range(300):
    params, state, metrics = step(params, state, *_batch(rng))
  return _held_out_retrieval_accuracy(params), metrics


@pytest.mark.slow
@pytest.mark.parametrize('signal', losses.RETRIEVER_SIGNALS)
def test_the_signal_alone_teaches_the_retriever_to_find_the_document(
    warm_reader, signal):
  after, metrics = _pretrain(warm_reader, signal, train_retriever=True)
  print(f'{signal}: retrieval accuracy {after:.3f} after (chance '
        f'{1 / (DOCS + 1):.3f}); fill accuracy '
        f'{float(metrics["masked_token_accuracy"]):.3f}; retrieval utility '
        f'{float(metrics["retrieval_utility"]):.2f} nats')
  assert after > 0.9
  assert metrics['masked_token_accuracy'] > 0.9
  assert metrics['retrieval_utility'] > 1.0  # Retrieval now helps the reader.


@pytest.mark.slow
@pytest.mark.parametrize('signal', losses.RETRIEVER_SIGNALS)
def test_with_the_retriever_frozen_the_same_run_does_not_learn(warm_reader,
                                                                signal):
  """The control: what the test above sees comes from the retriever's
  signal, not from the reader learning to fill values without it."""
  after, metrics = _pretrain(warm_reader, signal, train_retriever=False)
  assert after < 0.25
  assert metrics['masked_token_accuracy'] < 0.5
