"""The model gin files build the architectures they name."""

import os

import gin
import pytest

from realm_jax.models import pretrained
from realm_jax.models.bert import BertConfig

GIN_DIR = os.path.join(os.path.dirname(__file__), '..', 'gin', 'models')
ARCHITECTURE = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads',
                'intermediate_size', 'max_position_embeddings',
                'type_vocab_size')


def _config_from(name: str, *bindings: str) -> BertConfig:
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings([os.path.join(GIN_DIR, name)],
                                        list(bindings))
    return BertConfig()
  finally:
    gin.clear_config()


@pytest.mark.parametrize('name,expected', [
    ('bert_base.gin', (30522, 768, 12, 12, 3072, 512, 2)),
    ('minilm_l6.gin', (30522, 384, 6, 12, 1536, 512, 2)),
    ('tiny.gin', (30522, 128, 2, 2, 512, 512, 2)),
])
def test_gin_model_architecture(name, expected):
  config = _config_from(name)
  assert tuple(getattr(config, f) for f in ARCHITECTURE) == expected


def test_minilm_gin_matches_the_shipped_weights(minilm_dir):
  shipped = pretrained.config_from_hf(os.path.join(minilm_dir, 'config.json'))
  config = _config_from('minilm_l6.gin')
  assert {f: getattr(config, f) for f in ARCHITECTURE} == {
      f: getattr(shipped, f) for f in ARCHITECTURE}


def test_dtype_bindings_are_strings():
  config = _config_from('tiny.gin', "BertConfig.dtype = 'bfloat16'")
  assert config.dtype.name == 'bfloat16' and config.param_dtype.name == 'float32'
