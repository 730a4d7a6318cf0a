"""The model gin files build the architectures they name."""

import os

import gin
import pytest

from realm_jax.models import pretrained
from realm_jax.models.bert import BertConfig

pytestmark = pytest.mark.unit

REPO = os.path.join(os.path.dirname(__file__), '..')
GIN_DIR = os.path.join(REPO, 'gin', 'models')
ARCHITECTURE = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads',
                'intermediate_size', 'max_position_embeddings',
                'type_vocab_size')


def _config_from(name: str, *bindings: str) -> BertConfig:
  gin.parse_config_files_and_bindings([os.path.join(GIN_DIR, name)],
                                      list(bindings))
  return BertConfig()


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


BLOCK_LENGTHS = ('Ict.block_length', 'Pretrain.block_length',
                 'Finetune.block_length')
# The index builder reads the trainer's from the run's run.json: no file
# binds it.
BUILDER_BLOCK_LENGTH = 'run_refresh.block_length'


def _block_lengths(files) -> dict:
  """The block lengths `files` bind (macros resolved), by consumer."""
  gin.clear_config()
  gin.add_config_file_search_path(REPO)
  try:
    gin.parse_config_files_and_bindings(files, [])
    bound = {}
    for name in (*BLOCK_LENGTHS, BUILDER_BLOCK_LENGTH):
      try:
        value = gin.query_parameter(name)
      except ValueError:  # Not bound.
        continue
      if isinstance(value, gin.config.ConfigurableReference):
        value = value.scoped_configurable_fn()  # A macro: its value.
      bound[name] = value
    return bound
  finally:
    gin.clear_config()


@pytest.mark.parametrize('run', [None, 'ict', 'pretrain', 'finetune'])
@pytest.mark.parametrize('setup', sorted(os.listdir(
    os.path.join(REPO, 'gin', 'setups'))))
def test_every_consumer_reads_one_block_length(setup, run):
  """The trainer refuses an index cut unlike its own blocks, and `realm-jax
  eval` reads a setup without its run file: a setup binds every run kind's
  block length alike, or none; no file binds the builder's (it reads the
  trainer's from the run)."""
  alone = _block_lengths([f'gin/setups/{setup}'])
  assert not alone or set(alone) == set(BLOCK_LENGTHS), alone
  files = [f'gin/runs/{run}.gin'] if run else []
  bound = _block_lengths(files + [f'gin/setups/{setup}'])
  assert BUILDER_BLOCK_LENGTH not in bound
  assert len(set(bound.values())) <= 1, bound
