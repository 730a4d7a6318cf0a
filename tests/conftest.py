"""Shared fixtures: the embedded MiniLM weights and vocab, a tiny BERT.

Eight CPU devices are faked before JAX starts, so sharding tests can build
multi-device meshes; unsharded code still runs on device 0.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')

# pylint: disable=g-import-not-at-top,wrong-import-position
import pytest

from realm_jax import embedded
from realm_jax.models.bert import BertConfig


@pytest.fixture(scope='session')
def minilm_dir() -> str:
  return embedded.minilm_dir()


@pytest.fixture(scope='session')
def tokenizer(minilm_dir):
  from realm_jax.data.tokenization import WordPieceTokenizer
  return WordPieceTokenizer(os.path.join(minilm_dir, 'vocab.txt'))


@pytest.fixture
def tiny_config() -> BertConfig:
  """Two small layers over a small vocab: every test of the math runs on it."""
  return BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=48, max_position_embeddings=24)


def build_leads_corpus(root, tokenizer, num_leads: int,
                       validation_per_mille: int) -> str:
  """The first `num_leads` Wikipedia leads, built and annotated as
  `wiki_leads` under `root`; returns root (what REALM_CORPUS_DIR points at)."""
  import json
  from realm_jax.data import corpus, salient_spans
  with open(embedded.wiki_leads_json(), encoding='utf-8') as f:
    leads = dict(list(json.load(f).items())[:num_leads])
  source = root / 'leads.json'
  source.write_text(json.dumps(leads), encoding='utf-8')
  directory = str(root / 'wiki_leads')
  corpus.build_corpus(directory, tokenizer, wiki_leads_json=str(source),
                      blocks_per_shard=25 if num_leads < 100 else 100_000)
  salient_spans.annotate_corpus(directory, tokenizer, num_processes=1,
                                validation_per_mille=validation_per_mille)
  return str(root)


@pytest.fixture(scope='session')
def small_corpus(tmp_path_factory, tokenizer):
  """The first 60 Wikipedia leads (20% held out)."""
  return build_leads_corpus(tmp_path_factory.mktemp('corpora'), tokenizer, 60,
                            validation_per_mille=200)


@pytest.fixture
def small_corpus_gin(small_corpus, monkeypatch):
  """REALM_CORPUS_DIR at the small corpus and a clean gin config around the
  test (the CLI's gin parse locks the config)."""
  import gin
  monkeypatch.setenv('REALM_CORPUS_DIR', small_corpus)
  gin.clear_config()
  yield small_corpus
  gin.clear_config()
