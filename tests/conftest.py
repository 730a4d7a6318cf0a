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
