"""Pretrained weight import: MiniLM parity, TF checkpoints, clear errors."""

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from realm_jax import errors
from realm_jax.models import bert, pretrained
from realm_jax.models.bert import Bert, BertConfig, mean_pool

pytestmark = pytest.mark.unit

# Public reference: all-MiniLM-L6-v2's mean-pooled, L2-normalized embedding of
# "hello world" (sentence-transformers) begins with these values.
HELLO_WORLD_REFERENCE = [-0.034478, 0.03102, 0.00673, 0.02611, -0.039362]


def test_minilm_hello_world_parity(minilm_dir, tokenizer):
  config = pretrained.config_from_hf(os.path.join(minilm_dir, 'config.json'))
  params = pretrained.load_bert_params(minilm_dir, config)
  batch = tokenizer.numpy_join(['hello world'], max_length=8)
  np.testing.assert_array_equal(batch['token_ids'][0, :4], [101, 7592, 2088, 102])
  out = Bert(config).apply({'params': params}, batch['token_ids'],
                           batch['input_mask'], batch['token_type_ids'])
  embedding = mean_pool(out.sequence_output, batch['input_mask'])[0]
  embedding = embedding / jnp.linalg.norm(embedding)
  np.testing.assert_allclose(embedding[:5], HELLO_WORLD_REFERENCE, atol=1e-3)


def _hf_state_dict(config: BertConfig, seed=0) -> dict[str, np.ndarray]:
  """A BertModel state dict in PyTorch layout ([out, in] linear weights)."""
  rng = np.random.default_rng(seed)
  h, inter = config.hidden_size, config.intermediate_size
  state = {}

  def put(name, *shape):
    state[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)

  put('embeddings.word_embeddings.weight', config.vocab_size, h)
  put('embeddings.position_embeddings.weight',
      config.max_position_embeddings, h)
  put('embeddings.token_type_embeddings.weight', config.type_vocab_size, h)
  put('embeddings.LayerNorm.weight', h)
  put('embeddings.LayerNorm.bias', h)
  for i in range(config.num_layers):
    layer = f'encoder.layer.{i}.'
    for proj in ('self.query', 'self.key', 'self.value', 'output.dense'):
      put(f'{layer}attention.{proj}.weight', h, h)
      put(f'{layer}attention.{proj}.bias', h)
    put(f'{layer}intermediate.dense.weight', inter, h)
    put(f'{layer}intermediate.dense.bias', inter)
    put(f'{layer}output.dense.weight', h, inter)
    put(f'{layer}output.dense.bias', h)
    for norm in ('attention.output.LayerNorm', 'output.LayerNorm'):
      put(f'{layer}{norm}.weight', h)
      put(f'{layer}{norm}.bias', h)
  put('pooler.dense.weight', h, h)
  put('pooler.dense.bias', h)
  return state


def _tf_name(hf_name: str) -> str:
  """Google BERT's variable name for a Hugging Face BertModel tensor."""
  name = 'bert/' + re.sub(r'encoder\.layer\.(\d+)', r'encoder/layer_\1',
                          hf_name).replace('.', '/')
  if '/LayerNorm/' in name:
    return name.replace('/weight', '/gamma').replace('/bias', '/beta')
  if '_embeddings/' in name:
    return name.removesuffix('/weight')
  return name.replace('/weight', '/kernel')


def _write_tf_checkpoint(prefix: str, state: dict[str, np.ndarray]) -> None:
  """Writes a name-based checkpoint, as Google's BERT release was saved."""
  tensors = {}
  for hf_name, value in state.items():
    is_kernel = value.ndim == 2 and '_embeddings' not in hf_name
    tensors[_tf_name(hf_name)] = value.T if is_kernel else value
  # A pretraining checkpoint also holds heads and optimizer slots.
  tensors['cls/predictions/output_bias'] = np.zeros(7, np.float32)
  tensors['bert/embeddings/word_embeddings/adam_m'] = np.zeros(3, np.float32)
  tensors['global_step'] = np.array(1000, np.int64)
  names = sorted(tensors)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                    shape_and_slices=[''] * len(names),
                    tensors=[tf.constant(tensors[n]) for n in names])


@pytest.fixture
def pooled_config(tiny_config):
  return dataclasses.replace(tiny_config, add_pooler=True)


def test_tf_checkpoint_round_trip_matches_safetensors(tmp_path, pooled_config):
  state = _hf_state_dict(pooled_config)
  save_file(state, str(tmp_path / 'model.safetensors'))
  _write_tf_checkpoint(str(tmp_path / 'bert_model.ckpt'), state)

  from_hf = pretrained.load_bert_params(tmp_path / 'model.safetensors',
                                        pooled_config)
  from_tf = pretrained.load_bert_params(tmp_path / 'bert_model.ckpt',
                                        pooled_config)
  jax.tree.map(np.testing.assert_array_equal, from_hf, from_tf)
  # PyTorch stores [out, in]; the Flax kernel is [in, heads, head_dim].
  np.testing.assert_array_equal(
      from_tf['layers']['attention']['query']['kernel'][1].reshape(
          pooled_config.hidden_size, -1),
      state['encoder.layer.1.attention.self.query.weight'].T)

  token_ids = np.array([[2, 5, 9, 3, 0, 0]], np.int32)
  mask = (token_ids > 0).astype(np.int32)
  outs = [Bert(pooled_config).apply({'params': p}, token_ids, mask)
          for p in (from_hf, from_tf)]
  np.testing.assert_array_equal(outs[0].sequence_output, outs[1].sequence_output)
  np.testing.assert_array_equal(outs[0].pooled_output, outs[1].pooled_output)


def test_directory_with_a_tf_checkpoint_is_found(tmp_path, tiny_config):
  _write_tf_checkpoint(str(tmp_path / 'bert_model.ckpt'),
                       _hf_state_dict(tiny_config))
  params = pretrained.load_bert_params(tmp_path, tiny_config)
  assert set(params) == {'embeddings', 'layers'}


def test_scanned_and_unrolled_configs_load_the_same_weights(tmp_path,
                                                            tiny_config):
  """A file's per-layer tensors load stacked on the leading axis for a
  scanned config, one `layer_{i}` each for an unrolled one."""
  state = _hf_state_dict(tiny_config)
  save_file(state, str(tmp_path / 'model.safetensors'))
  scanned = pretrained.load_bert_params(tmp_path, tiny_config)
  unrolled = pretrained.load_bert_params(
      tmp_path, dataclasses.replace(tiny_config, scan_layers=False))
  assert set(unrolled) == {'embeddings', 'layer_0', 'layer_1'}
  jax.tree.map(np.testing.assert_array_equal, scanned,
               bert.stack_layers(unrolled, tiny_config.num_layers))
  np.testing.assert_array_equal(
      scanned['layers']['output']['kernel'][1],
      state['encoder.layer.1.output.dense.weight'].T)


def test_prefixed_and_gamma_beta_names_load(tmp_path, tiny_config):
  state = _hf_state_dict(tiny_config)
  renamed = {'bert.' + re.sub(r'LayerNorm\.weight$', 'LayerNorm.gamma',
                              re.sub(r'LayerNorm\.bias$', 'LayerNorm.beta', k)): v
             for k, v in state.items()}
  renamed['cls.predictions.bias'] = np.zeros(3, np.float32)
  save_file(state, str(tmp_path / 'plain.safetensors'))
  save_file(renamed, str(tmp_path / 'prefixed.safetensors'))
  jax.tree.map(np.testing.assert_array_equal,
               pretrained.load_bert_params(tmp_path / 'plain.safetensors',
                                           tiny_config),
               pretrained.load_bert_params(tmp_path / 'prefixed.safetensors',
                                           tiny_config))


def test_bf16_param_dtype_is_honoured(tmp_path, tiny_config):
  save_file(_hf_state_dict(tiny_config), str(tmp_path / 'model.safetensors'))
  config = dataclasses.replace(tiny_config, param_dtype='bfloat16')
  params = pretrained.load_bert_params(tmp_path, config)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype('bfloat16')}


def test_weights_of_another_architecture_are_named(tmp_path, tiny_config):
  gpt2_like = {'wte.weight': np.zeros((64, 32), np.float32),
               'h.0.attn.c_attn.weight': np.zeros((32, 96), np.float32)}
  path = tmp_path / 'gpt2.safetensors'
  save_file(gpt2_like, str(path))
  with pytest.raises(errors.WeightImportError) as error:
    pretrained.load_bert_params(path, tiny_config)
  message = str(error.value)
  assert str(path) in message
  assert 'unexpected (2)' in message and 'h.0.attn.c_attn.weight' in message
  assert 'missing' in message and 'embeddings.word_embeddings.weight' in message


def test_one_misshaped_tensor_is_named(tmp_path, tiny_config):
  state = _hf_state_dict(tiny_config)
  state['encoder.layer.1.intermediate.dense.weight'] = np.zeros((5, 32),
                                                                np.float32)
  save_file(state, str(tmp_path / 'model.safetensors'))
  with pytest.raises(errors.WeightImportError) as error:
    pretrained.load_bert_params(tmp_path, tiny_config)
  message = str(error.value)
  assert 'model.safetensors' in message and 'mis-shaped (1)' in message
  assert ('encoder.layer.1.intermediate.dense.weight: shape (5, 32) in the '
          'file, (48, 32) expected') in message
  assert 'missing' not in message and 'unexpected' not in message


def test_real_weights_into_the_wrong_size_are_refused(minilm_dir):
  with pytest.raises(errors.WeightImportError) as error:
    pretrained.load_bert_params(minilm_dir, BertConfig())  # BERT-base.
  message = str(error.value)
  assert 'model.safetensors' in message
  assert 'embeddings.word_embeddings.weight: shape (30522, 384)' in message
  # Layers 6..11 of BERT-base, 16 tensors each, are not in MiniLM.
  assert 'missing (96)' in message
  assert 'encoder.layer.6.attention.self.query.weight' in message


def test_missing_weights_name_the_path(tmp_path, tiny_config):
  with pytest.raises(FileNotFoundError, match='nothing.safetensors'):
    pretrained.load_bert_params(tmp_path / 'nothing.safetensors', tiny_config)
  with pytest.raises(FileNotFoundError, match='No BERT weights in directory'):
    pretrained.load_bert_params(tmp_path, tiny_config)


def test_config_from_hf_reads_the_architecture(minilm_dir):
  config = pretrained.config_from_hf(os.path.join(minilm_dir, 'config.json'))
  assert (config.hidden_size, config.num_layers, config.num_heads,
          config.intermediate_size) == (384, 6, 12, 1536)


def test_config_from_hf_refuses_other_models(tmp_path):
  path = tmp_path / 'config.json'
  path.write_text('{"model_type": "gpt2", "n_embd": 768}')
  with pytest.raises(errors.WeightImportError, match='config.json'):
    pretrained.config_from_hf(path)


def test_first_layers_of_a_deeper_checkpoint_load_only_when_asked(minilm_dir):
  config = pretrained.config_from_hf(os.path.join(minilm_dir, 'config.json'))
  shallow = dataclasses.replace(config, num_layers=2)
  with pytest.raises(errors.WeightImportError, match=r'unexpected \(64\)'):
    pretrained.load_bert_params(minilm_dir, shallow)
  first = pretrained.load_bert_params(minilm_dir, shallow,
                                      keep_first_layers=True)
  full = pretrained.load_bert_params(minilm_dir, config)
  query = lambda params: params['layers']['attention']['query']['kernel']
  assert query(first).shape[0] == 2 and query(full).shape[0] == 6
  np.testing.assert_array_equal(query(first), query(full)[:2])
