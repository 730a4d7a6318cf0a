"""ScaNN: recall against exact search, exclusions, serialization."""

import numpy as np
import pytest

from realm_jax.index.exact import exact_search
from realm_jax.index.scann_searcher import ScannSearcher, build_scann


def _recall(found, exact):
  return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact)])


@pytest.mark.unit
@pytest.mark.slow
def test_recall_at_8_on_100k_random_vectors():
  rng = np.random.default_rng(0)
  docs = rng.standard_normal((100_000, 128)).astype(np.float32)
  queries = rng.standard_normal((200, 128)).astype(np.float32)
  _, exact = exact_search(queries, docs, k=8)
  _, found = build_scann(docs).search(queries, 8)
  recall = _recall(found, np.asarray(exact))
  print(f'ScaNN recall@8 on 100k random 128-d vectors: {recall:.4f}')
  assert recall >= 0.95


@pytest.mark.unit
def test_exclusions_and_serialization(tmp_path):
  rng = np.random.default_rng(1)
  docs = rng.standard_normal((3_000, 32)).astype(np.float32)
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  queries = docs[:20] * 3  # Each query's best match is its own document.
  searcher = build_scann(docs)
  _, ids = searcher.search(queries, 8)
  np.testing.assert_array_equal(ids[:, 0], np.arange(20))
  _, ids = searcher.search(queries, 8, exclude_ids=np.arange(20))
  assert not np.any(ids == np.arange(20)[:, None])
  _, exact = exact_search(queries, docs, k=8, exclude_ids=np.arange(20)[:, None])
  assert _recall(ids, np.asarray(exact)) >= 0.95
  searcher.serialize(str(tmp_path / 'scann'))
  loaded = ScannSearcher.load(str(tmp_path / 'scann'))
  np.testing.assert_array_equal(loaded.search(queries, 8)[1],
                                searcher.search(queries, 8)[1])


@pytest.mark.unit
def test_small_corpora_are_searched_exactly():
  rng = np.random.default_rng(2)
  docs = rng.standard_normal((100, 16)).astype(np.float32)
  queries = rng.standard_normal((5, 16)).astype(np.float32)
  scores, ids = build_scann(docs).search(queries, 100)
  exact_scores, exact_ids = exact_search(queries, docs, k=100)
  np.testing.assert_array_equal(ids, exact_ids)
  np.testing.assert_allclose(scores, exact_scores, atol=1e-5)


@pytest.mark.integration
@pytest.mark.slow
def test_recall_at_8_on_real_corpus_embeddings(tmp_path, tokenizer, minilm_dir):
  """1,300 Wikipedia leads, cut into 96-wordpiece blocks, through the MiniLM
  document tower (128-d): enough blocks for ScaNN's hashing path."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax import default_files  # pylint: disable=g-import-not-at-top
  from realm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  from realm_jax.data.open_corpus import OpenCorpus  # pylint: disable=g-import-not-at-top
  from realm_jax.index.embed import DocumentEmbedder  # pylint: disable=g-import-not-at-top
  from realm_jax.models import pretrained  # pylint: disable=g-import-not-at-top
  from realm_jax.models.retriever import Retriever, init_retriever_params  # pylint: disable=g-import-not-at-top

  with open(default_files.wiki_leads_json(), encoding='utf-8') as f:
    leads = dict(list(json.load(f).items())[:1_300])
  (tmp_path / 'leads.json').write_text(json.dumps(leads), encoding='utf-8')
  corpus.build_corpus(str(tmp_path / 'corpus'), tokenizer,
                      wiki_leads_json=str(tmp_path / 'leads.json'),
                      max_block_length=96, max_title_length=32)
  config = pretrained.config_from_hf(os.path.join(minilm_dir, 'config.json'))
  retriever = Retriever(config)
  params = init_retriever_params(retriever, jax.random.key(0),
                                 pretrained.load_bert_params(minilm_dir, config))
  docs = DocumentEmbedder(retriever, 64)(params,
                                         OpenCorpus(str(tmp_path / 'corpus')).padded())
  assert len(docs) >= 2_048  # Hashing, not the brute-force fallback.
  titles = [t for t in leads][:200]
  query = tokenizer.numpy_join(titles, max_length=24)
  queries = np.asarray(retriever.apply(
      {'params': params}, query['token_ids'], query['input_mask'],
      query['token_type_ids'], method='embed_query'))
  _, exact = exact_search(queries, docs, k=8)
  _, found = build_scann(docs).search(queries, 8)
  recall = _recall(found, np.asarray(exact))
  print(f'ScaNN recall@8 on {len(docs):,} real block embeddings: {recall:.4f}')
  assert recall >= 0.95
