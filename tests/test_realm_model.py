"""Retriever, knowledge-augmented encoder and their composition."""

import dataclasses
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from realm_jax.models import pretrained
from realm_jax.models import reader as reader_lib
from realm_jax.models.bert import Bert
from realm_jax.models.realm import Realm
from realm_jax.models.retriever import Retriever, init_retriever_params
from realm_jax.training import objectives, step_inputs

pytestmark = pytest.mark.unit


def _tokens(rng, shape, vocab=64, length=None):
  token_ids = rng.integers(5, vocab, shape).astype(np.int32)
  token_ids[..., 0] = 2
  mask = np.ones(shape, np.int32)
  if length is not None:
    mask[..., length:] = 0
  types = np.zeros(shape, np.int32)
  types[..., shape[-1] // 2:] = 1
  # In the order of the towers' arguments.
  return {'token_ids': token_ids * mask, 'input_mask': mask,
          'token_type_ids': types * mask}


@pytest.mark.parametrize('share,towers', [
    (True, {'embedder'}), (False, {'query_embedder', 'document_embedder'})])
def test_retriever_towers(tiny_config, share, towers):
  rng = np.random.default_rng(0)
  query, docs = _tokens(rng, (2, 6)), _tokens(rng, (2, 3, 8))
  # A wide init: BERT's 0.02 makes every [CLS] state (nearly) the same.
  config = dataclasses.replace(tiny_config, initializer_range=0.5)
  retriever = Retriever(config, projection_size=16, share_towers=share)
  params = nn.meta.unbox(retriever.init(jax.random.key(0), query, docs))
  assert set(params['params']) == towers
  for tower in towers:
    assert set(params['params'][tower]) == {'bert', 'projection', 'layer_norm'}
  scores = retriever.apply(params, query, docs)
  q = retriever.apply(params, *query.values(), method='embed_query')
  d = retriever.apply(params, *docs.values(), method='embed_documents')
  assert q.shape == (2, 16) and d.shape == (2, 3, 16)
  np.testing.assert_allclose(scores, np.einsum('bd,bkd->bk', q, d), rtol=1e-5)
  # LayerNorm output: zero mean, unit variance before scale and bias.
  np.testing.assert_allclose(np.mean(q, -1), 0, atol=1e-5)
  if share:  # One tower: the query and document embeddings coincide.
    np.testing.assert_allclose(
        retriever.apply(params, *query.values(), method='embed_documents'), q)


def test_mlm_head_decodes_with_the_word_embeddings(tiny_config):
  rng = np.random.default_rng(1)
  inputs = _tokens(rng, (2, 3, 8))
  positions = np.array([[1, 2], [3, 1]], np.int32)
  encoder = reader_lib.KnowledgeAugmentedEncoder(tiny_config)
  params = nn.meta.unbox(encoder.init(jax.random.key(0), inputs, positions))
  head = params['params']['mlm_head']
  assert set(head) == {'transform', 'transform_layer_norm', 'output_bias'}
  logits = encoder.apply(params, inputs, positions, method='masked_lm_logits')
  assert logits.shape == (2, 3, 2, tiny_config.vocab_size)

  # logits = LN(gelu(W h + b)) E^T + bias, with E the input word embeddings.
  hidden = encoder.apply(params, inputs, True, method='_encode')
  h = hidden.reshape(2, 3, 8, -1)[np.arange(2)[:, None, None],
                                  np.arange(3)[None, :, None],
                                  positions[:, None, :]]
  h = jax.nn.gelu(h @ head['transform']['kernel'] + head['transform']['bias'],
                  approximate=False)
  ln = head['transform_layer_norm']
  h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True)
                                                 + tiny_config.layer_norm_eps)
  h = h * ln['scale'] + ln['bias']
  embeddings = params['params']['bert']['embeddings']['word_embeddings'][
      'embedding']
  np.testing.assert_allclose(logits, h @ embeddings.T + head['output_bias'],
                             rtol=1e-4, atol=1e-4)


def test_span_mask_keeps_spans_inside_z():
  block_mask = np.array([[0, 0, 1, 1, 1, 0]])
  got = np.asarray(reader_lib.span_mask(block_mask, 3))
  for i, w in itertools.product(range(6), range(3)):
    inside = i + w < 6 and all(block_mask[0, i:i + w + 1])
    assert got[0, i, w] == inside, (i, w)


def test_gold_spans_are_every_occurrence_of_every_answer():
  token_ids = np.array([[[1, 7, 8, 9, 7, 8, 5, 7, 0]]])
  block_mask = np.array([[[0, 0, 1, 1, 1, 1, 1, 1, 0]]])  # The query is 0..1.
  answers = np.array([[[7, 8, 0], [5, 0, 0], [9, 7, 8], [6, 0, 0]]])
  got = np.asarray(reader_lib.gold_span_mask(
      token_ids, block_mask, answers, answers > 0, max_span_width=2))
  expected = np.zeros((1, 1, 9, 2), bool)
  expected[0, 0, 4, 1] = True  # "7 8" at 4; the "7 8" at 1 is in the query.
  expected[0, 0, 6, 0] = True  # "5" at 6.
  # "9 7 8" is longer than max_span_width; "6" does not occur; the final "7"
  # alone is not an answer.
  np.testing.assert_array_equal(got, expected)


def test_the_beams_answer_rule_is_the_gold_span_rule_on_the_host():
  """`step_inputs.blocks_holding_answers` (ORQA's beam, host) says a block holds
  an answer exactly where `gold_span_mask` (the read blocks, device) finds
  a gold span, on random wordpieces over a 5-token vocabulary."""
  rng = np.random.default_rng(3)
  token_ids = rng.integers(1, 6, (4, 16, 12))
  searchable = rng.random((4, 16, 12)) < 0.8
  answers = rng.integers(1, 6, (4, 3, 3)) * (
      np.arange(3) < rng.integers(0, 4, (4, 3, 1)))  # 0 to 3 wordpieces.
  held = step_inputs.blocks_holding_answers(token_ids, searchable, answers)
  gold = np.asarray(reader_lib.gold_span_mask(
      token_ids, searchable, answers, answers > 0, max_span_width=3))
  np.testing.assert_array_equal(held, gold.any(axis=(2, 3)))
  assert 0 < held.mean() < 1


def test_realm_outputs(tiny_config):
  rng = np.random.default_rng(2)
  query = _tokens(rng, (2, 6))
  query['token_type_ids'][:] = 0
  candidates = _tokens(rng, (2, 4, 8), length=7)
  positions = np.array([[1], [2]], np.int32)
  model = Realm(tiny_config, tiny_config, projection_size=16, reader_length=12,
                max_span_width=3)
  params = nn.meta.unbox(model.init(jax.random.key(0), query, candidates,
                                    positions))
  assert set(params['params']) == {'retriever', 'reader'}
  scores, logits = model.apply(params, query, candidates, positions,
                               method='pretrain')
  assert scores.shape == (2, 4) and logits.shape == (2, 4, 1, 64)
  frozen = rng.standard_normal((2, 4, 16)).astype(np.float32)
  qa_scores, spans, inputs = model.apply(params, query, candidates, frozen,
                                         method='read_spans')
  assert spans.shape == (2, 4, 12, 3) and inputs['block_mask'].shape == (2, 4,
                                                                          12)
  # Fine-tuning scores come from the frozen embeddings, not the doc tower.
  q = model.apply(params, *query.values(),
                  method=lambda m, *a: m.retriever.embed_query(*a))
  np.testing.assert_allclose(qa_scores, np.einsum('bd,bkd->bk', q, frozen),
                             rtol=1e-5)


@pytest.mark.parametrize('train_document_tower', [False, True])
def test_end_to_end_fine_tuning_trains_the_document_tower(
    tiny_config, train_document_tower):
  """Trained, the candidates are scored by the document tower's embeddings
  of their wordpieces, and the loss's gradient reaches that tower; frozen
  (the paper), by the index's embeddings, and it does not."""
  rng = np.random.default_rng(3)
  model = Realm(tiny_config, tiny_config, projection_size=16,
                reader_length=16, max_span_width=3, share_towers=False)
  objective = objectives.SpanQa(model, query_length=6, max_answers=2,
                                max_answer_length=2, num_candidates=3,
                                block_length=8,
                                train_document_tower=train_document_tower)
  params = nn.meta.unbox(jax.jit(objective.init)(jax.random.key(0)))
  query = _tokens(rng, (2, 6))
  query['token_type_ids'][:] = 0
  candidates = _tokens(rng, (2, 3, 8), length=7)
  documents = jax.jit(lambda p: model.apply(
      {'params': p}, *candidates.values(),
      method=lambda m, *a: m.retriever.embed_documents(*a)))(params)
  # Candidate 0's body, before its [SEP].
  answers = candidates['token_ids'][:, 0, 4:6][:, None].repeat(2, axis=1)
  inputs = {'query': query, 'candidates': candidates,
            'candidate_mask': np.ones((2, 3), bool),
            'answer_token_ids': answers,
            'answer_mask': (answers > 0).astype(np.int32)}
  abstract = objective.abstract_inputs(2, 8)
  assert ('candidate_embeddings' in abstract) != train_document_tower
  if not train_document_tower:
    # The index's embeddings, here those of the tower before it moved.
    inputs['candidate_embeddings'] = np.asarray(documents)
  scores = jax.jit(lambda p, embeddings: model.apply(
      {'params': p}, query, candidates, embeddings, method='read_spans')[0])
  np.testing.assert_allclose(scores(params, None), scores(params, documents),
                             rtol=1e-5, atol=1e-6)

  (_, metrics), grads = jax.jit(jax.value_and_grad(
      lambda p: objective.loss(p, inputs, jax.random.key(1), True),
      has_aux=True))(params)
  # The answer is in some candidates, not all: p(z|x) has a gradient.
  assert 0 < metrics['answer_recall']
  grads = grads['retriever']
  tower = lambda tree: jax.tree.leaves(tree['document_embedder'])
  reached = max(float(jnp.abs(g).max()) for g in tower(grads))
  assert (reached > 0) == train_document_tower
  assert all(float(jnp.abs(g).max()) > 0
             for g in jax.tree.leaves(grads['query_embedder']['projection']))
  frozen = objective.frozen(params)['retriever']
  # Every leaf of the document tower frozen, or none.
  assert set(tower(frozen)) == {not train_document_tower}
  assert not any(jax.tree.leaves(frozen['query_embedder']))


def _projected_and_normed(pooled, params, eps):
  """A tower's head in numpy: LayerNorm(Dense(pooled))."""
  projected = pooled @ params['projection']['kernel'] + params['projection'][
      'bias']
  normed = (projected - projected.mean(-1, keepdims=True)) / np.sqrt(
      projected.var(-1, keepdims=True) + eps)
  return normed * params['layer_norm']['scale'] + params['layer_norm']['bias']


def test_mean_pooling_projects_the_mean_of_the_real_tokens(tiny_config):
  rng = np.random.default_rng(1)
  docs = _tokens(rng, (1, 2, 8))
  retriever = Retriever(tiny_config, projection_size=16, pooling='mean')
  params = nn.meta.unbox(retriever.init(jax.random.key(0), _tokens(rng, (1, 4)),
                                        docs))['params']['embedder']
  flat = {k: v[0] for k, v in docs.items()}
  states = Bert(tiny_config).apply({'params': params['bert']},
                                   flat['token_ids'], flat['input_mask'],
                                   flat['token_type_ids']).sequence_output
  mask = np.asarray(flat['input_mask'], np.float32)[..., None]
  mean = np.sum(np.asarray(states) * mask, 1) / mask.sum(1)
  np.testing.assert_allclose(
      retriever.apply({'params': {'embedder': params}}, *docs.values(),
                      method='embed_documents')[0],
      _projected_and_normed(mean, params, tiny_config.layer_norm_eps),
      rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="pooling='max'"):
    Retriever(tiny_config, pooling='max').init(
        jax.random.key(0), _tokens(rng, (1, 4)), docs)


def test_pooler_pooling_projects_berts_tanh_pooler_of_cls(tiny_config):
  """The released towers: LayerNorm(Dense(tanh(W h_[CLS] + b)))."""
  rng = np.random.default_rng(2)
  docs = _tokens(rng, (1, 2, 8))
  retriever = Retriever(tiny_config, projection_size=16, pooling='pooler')
  params = nn.meta.unbox(retriever.init(jax.random.key(0), _tokens(rng, (1, 4)),
                                        docs))['params']['embedder']
  assert set(params['bert']['pooler']) == {'kernel', 'bias'}
  flat = {k: v[0] for k, v in docs.items()}
  states = Bert(tiny_config).apply(
      {'params': {k: v for k, v in params['bert'].items() if k != 'pooler'}},
      flat['token_ids'], flat['input_mask'],
      flat['token_type_ids']).sequence_output
  pooler = params['bert']['pooler']
  pooled = np.tanh(np.asarray(states)[:, 0] @ pooler['kernel'] +
                   pooler['bias'])
  np.testing.assert_allclose(
      retriever.apply({'params': {'embedder': params}}, *docs.values(),
                      method='embed_documents')[0],
      _projected_and_normed(pooled, params, tiny_config.layer_norm_eps),
      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('pooling,spread', [('cls', False), ('mean', True)])
def test_minilm_cut_to_two_layers_needs_mean_pooling(minilm_dir, tokenizer,
                                                     pooling, spread):
  """The demo's towers: with [CLS] every text gets the same embedding (the
  index collapses and retrieval is random); the mean keeps texts apart."""
  config = dataclasses.replace(pretrained.config_from_hf(
      os.path.join(minilm_dir, 'config.json')), num_layers=2)
  bert = pretrained.load_bert_params(minilm_dir, config,
                                     keep_first_layers=True)
  retriever = Retriever(config, pooling=pooling)
  params = init_retriever_params(retriever, jax.random.key(0), bert)
  texts = ['The zebra is an African equine with black and white stripes.',
           'Paris is the capital and largest city of France.',
           'The mitochondrion is the powerhouse of the cell.',
           'Johann Sebastian Bach was a German composer.']
  batch = tokenizer.numpy_join(texts, max_length=32)
  e = np.asarray(retriever.apply({'params': params}, batch['token_ids'],
                                 batch['input_mask'], batch['token_type_ids'],
                                 method='embed_documents'))
  e = e / np.linalg.norm(e, axis=-1, keepdims=True)
  cosine = (e @ e.T)[~np.eye(len(texts), dtype=bool)]
  assert (cosine.max() < 0.95) == spread, cosine


def test_retrieval_temperature_divides_every_score(tiny_config):
  rng = np.random.default_rng(3)
  query = _tokens(rng, (2, 6))
  candidates = _tokens(rng, (2, 4, 8), length=7)
  frozen = rng.standard_normal((2, 4, 16)).astype(np.float32)
  positions = np.array([[1], [2]], np.int32)
  make = lambda tau: Realm(tiny_config, tiny_config, projection_size=16,
                           reader_length=12, max_span_width=3,
                           retrieval_temperature=tau)
  params = nn.meta.unbox(make(1.0).init(jax.random.key(0), query, candidates,
                                        positions))
  scores = {tau: (make(tau).apply(params, query, candidates, positions,
                                  method='pretrain')[0],
                  make(tau).apply(params, query, candidates, frozen,
                                  method='read_spans')[0])
            for tau in (1.0, 4.0)}
  for raw, cooled in zip(scores[1.0], scores[4.0]):
    np.testing.assert_allclose(cooled, raw / 4.0, rtol=1e-6)
    # The same ranking: the index and its search do not change.
    np.testing.assert_array_equal(np.argsort(cooled), np.argsort(raw))
  with pytest.raises(ValueError, match='retrieval_temperature=0'):
    make(0.0).init(jax.random.key(0), query, candidates, positions)


def test_one_candidate_skips_the_towers(tiny_config):
  """The no-retrieval baseline's p(z|x) is 1 for its single candidate: the
  loss is the same without running the towers."""
  from realm_jax.models import losses  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(4)
  query = _tokens(rng, (2, 6))
  candidates = _tokens(rng, (2, 1, 8), length=7)
  positions = np.array([[1, 2], [2, 3]], np.int32)
  targets = rng.integers(5, 64, (2, 2)).astype(np.int32)
  model = Realm(tiny_config, tiny_config, projection_size=16,
                reader_length=12, max_span_width=3)
  params = nn.meta.unbox(model.init(jax.random.key(0), query, candidates,
                                    positions))
  scores, logits = model.apply(params, query, candidates, positions,
                               method='pretrain')
  np.testing.assert_array_equal(scores, np.zeros((2, 1)))
  towers = model.apply(params, query, candidates, method='relevance')
  assert np.all(np.abs(np.asarray(towers)) > 0)
  ones = np.ones((2, 1), bool)
  loss = lambda s: losses.realm_mlm_loss(s, ones, logits, targets,
                                         np.ones((2, 2), np.int32))[0]
  np.testing.assert_allclose(loss(scores), loss(towers), rtol=1e-6)
