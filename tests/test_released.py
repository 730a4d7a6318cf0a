"""`realm-jax import` of Google's released REALM, against Hugging Face's port.

The fixture (tests/fixtures/released/orqa_tiny) is a tiny RealmForOpenQA with
random weights in the released Hugging Face layout, with what transformers
4.57.6 computed on it. The import must reproduce that computation: the query
embeddings, the retrieval, the reader's span logits and the predicted answer.
The same weights written in the TensorFlow layouts (ORQA's checkpoint, the
TF-Hub modules) must import to the same parameters.

Those TensorFlow files are named from tests/fixtures/released/tf_names.txt:
the released files' variable names and shapes as public sources give them
(Hugging Face's conversion mapping, google-research/language's model code),
not the table the importer reads (`layouts`), so a wrong name there fails
the import. Each of these faults in realm_jax/released/layouts.py, one at a
time, fails `test_tensorflow_layouts_import_the_same_weights` (run on
2026-11-26, each prefix set to 'bogus/'): the retriever tower, projection,
reader BERT, MLM head or span scorer prefix of `orqa`; the tower or the
projection prefix of `hub_embedder`; the reader BERT or the MLM head prefix
of `hub_bert`; and the `ignored` patterns of any of the three, emptied.
"""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

from realm_jax import errors, run_directory
from realm_jax.data import corpus, open_qa
from realm_jax.data.answer_matching import normalize_answer
from realm_jax.evaluation import qa_evaluation
from realm_jax.index import publication
from realm_jax.models.reader import KnowledgeAugmentedEncoder
from realm_jax.models.realm import model_retriever
from realm_jax.released import importer, tensor_files
from realm_jax.training import run_loader
from realm_jax.input.tasks import common

pytestmark = pytest.mark.integration

FIXTURE = pathlib.Path(__file__).parent / 'fixtures' / 'released' / 'orqa_tiny'
EXPECTED = np.load(FIXTURE / 'expected.npz')
QUESTIONS = json.loads((FIXTURE / 'expected.json').read_text())['questions']
TOLERANCE = {'rtol': 1e-5, 'atol': 1e-5}
TF_NAMES = FIXTURE.parent / 'tf_names.txt'
# tf_names.txt's shape symbols: fields of the fixture's config.json.
SHAPE_SYMBOLS = {'V': 'vocab_size', 'P': 'max_position_embeddings',
                 'T': 'type_vocab_size', 'H': 'hidden_size',
                 'I': 'intermediate_size', 'R': 'retriever_proj_size',
                 'S': 'span_hidden_size'}


@pytest.fixture
def released_env(tmp_path, monkeypatch):
  """The fixture's vocabulary for the tasks, corpora under tmp_path."""
  monkeypatch.setenv(common.VOCAB_ENV, str(FIXTURE / 'vocab.txt'))
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(tmp_path / 'corpora'))
  common.vocabulary.cache_clear()
  yield tmp_path
  common.vocabulary.cache_clear()


def _import(tmp_path, name='run', **kwargs):
  kwargs.setdefault('sources', [str(FIXTURE)])
  kwargs.setdefault('blocks', str(FIXTURE / 'block_records.npy'))
  return importer.import_released(str(tmp_path / name), **kwargs)


def _loaded(model_dir):
  run = run_loader.load_run(model_dir)
  return run.run.objective.model, run_directory.restore_params(model_dir)[1]


def _reader(model):
  return KnowledgeAugmentedEncoder(model.reader_config,
                                   model.span_projection_size,
                                   model.max_span_width,
                                   model.span_layer_norm_eps)


def _query(q: int) -> dict:
  ids = EXPECTED[f'q{q}_question_input_ids'][None]
  return {'token_ids': ids, 'input_mask': np.ones_like(ids),
          'token_type_ids': np.zeros_like(ids)}


def _span_grid(q: int, width: int):
  """HF's flat span logits [k, C] as our [k, L, W] grid, and its mask."""
  starts, ends = EXPECTED[f'q{q}_candidate_starts'], EXPECTED[
      f'q{q}_candidate_ends']
  logits, mask = EXPECTED[f'q{q}_reader_logits_raw'], EXPECTED[
      f'q{q}_candidate_mask'].astype(bool)
  k, length = EXPECTED[f'q{q}_reader_input_ids'].shape
  grid = np.zeros((k, length, width), np.float32)
  valid = np.zeros((k, length, width), bool)
  grid[:, starts, ends - starts] = logits
  valid[:, starts, ends - starts] = mask
  return grid, valid


def test_import_reproduces_hugging_faces_realm_for_open_qa(released_env):
  summary = _import(released_env)
  assert summary['kind'] == 'Finetune'
  model, params = _loaded(summary['model_dir'])
  index = publication.index_manager(
      run_directory.index_dir(summary['model_dir']), read_only=True)
  block_emb = publication.read_embeddings(index, 0)
  np.testing.assert_array_equal(block_emb, EXPECTED['block_emb'])

  for q, question in enumerate(QUESTIONS):
    query = _query(q)
    projection = model_retriever(model).apply(
        {'params': params['retriever']}, query['token_ids'],
        query['input_mask'], query['token_type_ids'], method='embed_query')
    np.testing.assert_allclose(projection[0],
                               EXPECTED[f'q{q}_question_projection'],
                               **TOLERANCE)
    scores = block_emb @ np.asarray(projection[0])
    top = np.argsort(-scores)[:3]
    np.testing.assert_array_equal(top, EXPECTED[f'q{q}_retrieved_block_ids'])
    np.testing.assert_allclose(scores[top], EXPECTED[f'q{q}_retrieved_logits'],
                               **TOLERANCE)

    inputs = {'token_ids': EXPECTED[f'q{q}_reader_input_ids'][None],
              'input_mask': EXPECTED[f'q{q}_reader_attention_mask'][None],
              'token_type_ids': EXPECTED[f'q{q}_reader_token_type_ids'][None]}
    spans = np.asarray(_reader(model).apply(
        {'params': params['reader']}, inputs, method='span_logits'))[0]
    grid, valid = _span_grid(q, model.max_span_width)
    np.testing.assert_allclose(spans[valid], grid[valid], **TOLERANCE)

    # ORQA's prediction: the best span of the top blocks by f(x, z) + S(z, s).
    joint = np.where(valid, spans + scores[top][:, None, None], -np.inf)
    z, start, w = np.unravel_index(np.argmax(joint), joint.shape)
    assert (z, start, start + w) == (
        EXPECTED[f'q{q}_predicted_block_index'],
        EXPECTED[f'q{q}_predicted_start'], EXPECTED[f'q{q}_predicted_end'])
    np.testing.assert_array_equal(
        inputs['token_ids'][0, z, start:start + w + 1],
        EXPECTED[f'q{q}_predicted_answer_ids'])
    assert question['predicted_answer']


# `eval` then `ask`, in a process of their own: the seqio tasks take their
# vocabulary ($REALM_VOCAB) when they are registered, at import.
EVAL_AND_ASK = """
import sys
import gin
from realm_jax import main
model_dir, output_dir, question = sys.argv[1:]
main.main(['eval', '--model_dir=' + model_dir, '--task=nq_open',
           '--output_dir=' + output_dir])
gin.clear_config()
main.main(['ask', question, '--model_dir=' + model_dir])
"""


def test_eval_and_ask_on_the_import_answer_as_hugging_face_does(
    released_env, monkeypatch):
  """The whole path a user takes: `eval` and `ask` on the imported run, with
  our tokenizer, retrieval and reader inputs, pick Hugging Face's answer
  (ORQA's rule, which the import binds)."""
  data = released_env / 'data' / 'nq_open'
  data.mkdir(parents=True)
  (data / 'NQ-open.dev.jsonl').write_text(''.join(
      json.dumps({'question': q['question'], 'answer': [q['answer']]}) + '\n'
      for q in QUESTIONS))
  monkeypatch.setenv(open_qa.DATA_DIR_ENV, str(released_env / 'data'))
  model_dir = _import(released_env)['model_dir']
  output_dir = released_env / 'eval'
  done = subprocess.run(
      [sys.executable, '-c', EVAL_AND_ASK, model_dir, str(output_dir),
       QUESTIONS[0]['question']], capture_output=True, text=True, check=False,
      timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = qa_evaluation.read_predictions(str(output_dir), 'nq_open')
  vocabulary = common.vocabulary()
  for q, (row, question) in enumerate(zip(rows, QUESTIONS)):
    assert row['question'] == question['question']
    assert [r['block_id'] for r in row['retrieved'][:3]] == EXPECTED[
        f'q{q}_retrieved_block_ids'].tolist()
    hf_answer = vocabulary.decode(EXPECTED[f'q{q}_predicted_answer_ids'])
    assert normalize_answer(row['prediction']) == normalize_answer(
        hf_answer), q
  assert f'A: {rows[0]["prediction"]}   p(z,s|x) = ' in done.stdout
  # The blocks it read, best first (the released blocks have no titles).
  bodies = json.loads((FIXTURE / 'expected.json').read_text())['bodies']
  shown = [bodies[i][:20] for i in EXPECTED['q0_retrieved_block_ids']]
  assert [done.stdout.index(b) for b in shown] == sorted(
      done.stdout.index(b) for b in shown)


def _released_names() -> dict[str, list[list[str]]]:
  """tf_names.txt: for each released file, its [TF name, shape, Hugging
  Face name] rows."""
  sections, rows = {}, None
  for line in TF_NAMES.read_text().splitlines():
    if line.startswith('['):
      rows = sections.setdefault(line.strip('[]'), [])
    elif line and not line.startswith('#'):
      rows.append(line.split())
  return sections


def _shape(rule: str) -> tuple[int, ...]:
  """A tf_names.txt shape ('H,2S') for the fixture's config."""
  config = json.loads((FIXTURE / 'config.json').read_text())
  return tuple(int(d) if d.isdigit() else
               int(d[:-1] or 1) * config[SHAPE_SYMBOLS[d[-1]]]
               for d in rule.split(','))


def _released_file(section: str, state: dict) -> dict:
  """The fixture's weights under a released file's names (tf_names.txt),
  each from its Hugging Face name, kernels transposed back to [in, out]."""
  tensors = {}
  for tf_name, rule, hf_name in _released_names()[section]:
    value = state[hf_name]
    if tf_name.endswith('/kernel'):
      value = value.T
    assert value.shape == _shape(rule), (
        f'tf_names.txt: {tf_name} is {rule} = {_shape(rule)}, but '
        f'{hf_name} gives {value.shape}')
    tensors[tf_name] = value
  return tensors


def _trained(tensors: dict) -> dict:
  """A trainer's checkpoint of `tensors`: with the global step and each
  variable's Adam slots (google-research/bert's optimizer), whose values
  differ from the variable's so that reading one in its place shows."""
  out = dict(tensors, global_step=np.int64(300000))
  for name, value in tensors.items():
    out[f'{name}/adam_m'] = np.full_like(value, 0.5)
    out[f'{name}/adam_v'] = np.full_like(value, 2.0)
  return out


def _assert_params_equal(got, want, what: str) -> None:
  def check(path, a, b):
    np.testing.assert_array_equal(
        a, b, err_msg=f'{what}: {jax.tree_util.keystr(path)}')
  jax.tree_util.tree_map_with_path(check, got, want)


def _save_tf(prefix: str, tensors: dict) -> None:
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(tensors),
                    shape_and_slices=[''] * len(tensors),
                    tensors=[tf.constant(v) for v in tensors.values()])


def _write_tfrecord(path, texts):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for text in texts:
      writer.write(text.encode('utf-8'))


def test_tensorflow_layouts_import_the_same_weights(released_env):
  """The fixture's weights written under the released TensorFlow names
  (tf_names.txt) import to the parameters of Hugging Face's file."""
  tmp_path = released_env
  reference = _import(tmp_path, 'hf')
  model, hf_params = _loaded(reference['model_dir'])
  state = {n: tensor_files.open_tensor_file(str(FIXTURE)).read(n)
           for n in tensor_files.open_tensor_file(str(FIXTURE)).infos()}
  # ORQA's checkpoint holds every weight of RealmForOpenQA (the MLM decoder
  # is the word embeddings; block_emb is a file of its own).
  written = {hf for _, _, hf in _released_names()['orqa']}
  weights = {n for n in state if n != 'block_emb' and '.decoder.' not in n}
  assert written == weights, sorted(written ^ weights)
  orqa = _released_file('orqa', state)
  (tmp_path / 'orqa').mkdir()
  _save_tf(str(tmp_path / 'orqa' / 'model.ckpt-300000'), _trained(orqa))
  (tmp_path / 'encoded').mkdir()
  _save_tf(str(tmp_path / 'encoded' / 'encoded.ckpt'),
           {'block_emb': state['block_emb']})
  bodies = [b.decode() for b in np.load(FIXTURE / 'block_records.npy',
                                        allow_pickle=True)]
  titles = json.loads((FIXTURE / 'titles.json').read_text())
  _write_tfrecord(tmp_path / 'blocks.tfr', bodies)
  _write_tfrecord(tmp_path / 'titles.tfr', titles)
  bindings = importer.hf_bindings([str(FIXTURE)])
  summary = _import(
      tmp_path, 'tf', sources=[str(tmp_path / 'orqa' / 'model.ckpt-300000')],
      block_emb=str(tmp_path / 'encoded' / 'encoded.ckpt'),
      blocks=str(tmp_path / 'blocks.tfr'), titles=str(tmp_path / 'titles.tfr'),
      corpus_name='with_titles', gin_bindings=bindings)
  assert summary['sources'] == {
      str(tmp_path / 'orqa' / 'model.ckpt-300000'): 'orqa'}
  _, tf_params = _loaded(summary['model_dir'])
  _assert_params_equal(tf_params, hf_params, 'ORQA checkpoint vs HF')
  # A few by hand, from the written names to our parameters.
  tower, reader = tf_params['retriever']['embedder'], tf_params['reader']
  for name, imported in (
      ('module/module/module/module/bert/embeddings/word_embeddings',
       tower['bert']['embeddings']['word_embeddings']['embedding']),
      ('module/module/module/dense/kernel', tower['projection']['kernel']),
      ('module/module/module/LayerNorm/gamma', tower['layer_norm']['scale']),
      ('reader/module/bert/encoder/layer_1/intermediate/dense/kernel',
       reader['bert']['layers']['intermediate']['kernel'][1]),
      ('reader/module/cls/predictions/output_bias',
       reader['mlm_head']['output_bias']),
      ('reader/dense/kernel', np.concatenate(
          [reader['span_head']['start']['kernel'],
           reader['span_head']['end']['kernel']], -1)),
      ('reader/dense_1/kernel', reader['span_head']['score']['kernel'])):
    np.testing.assert_array_equal(imported, orqa[name], err_msg=name)

  # The corpus with titles re-embeds to the released embeddings.
  blocks = list(corpus.read_blocks(summary['corpus_dir']).as_numpy_iterator())
  assert [b['title'].decode() for b in blocks] == titles
  ids = [b['token_ids'] for b in blocks]
  length = max(map(len, ids))
  token_ids = np.array([np.pad(i, (0, length - len(i))) for i in ids])
  title_lengths = np.array([b['title_length'] for b in blocks])
  positions = np.arange(length)
  token_types = (positions[None] > title_lengths[:, None] + 1).astype(np.int32)
  mask = (token_ids > 0).astype(np.int32)
  embedded = model_retriever(model).apply(
      {'params': tf_params['retriever']}, token_ids, mask,
      token_types * mask, method='embed_documents')
  np.testing.assert_allclose(embedded, EXPECTED['block_emb'], **TOLERANCE)

  # The pre-trained TF-Hub modules: the embedder and the encoder apart.
  for section, name in (('hub_embedder', 'embedder'), ('hub_bert', 'bert')):
    (tmp_path / name / 'variables').mkdir(parents=True)
    _save_tf(str(tmp_path / name / 'variables' / 'variables'),
             _released_file(section, state))
  pre = _import(tmp_path, 'pretrained',
                sources=[str(tmp_path / 'embedder'), str(tmp_path / 'bert')],
                block_emb=str(tmp_path / 'encoded' / 'encoded.ckpt'),
                blocks=str(tmp_path / 'blocks.tfr'),
                titles=str(tmp_path / 'titles.tfr'), corpus_name='pre',
                gin_bindings=bindings)
  assert pre['kind'] == 'Pretrain'
  assert sorted(pre['sources'].values()) == ['hub_bert', 'hub_embedder']
  _, pre_params = _loaded(pre['model_dir'])
  _assert_params_equal(pre_params['retriever'], hf_params['retriever'],
                       'embedder module vs HF')
  for part in ('bert', 'mlm_head'):
    _assert_params_equal(pre_params['reader'][part], hf_params['reader'][part],
                         f'encoder module vs HF, reader {part}')


@pytest.mark.parametrize('change', ['rename', 'reshape'])
def test_a_file_that_does_not_fit_is_refused_naming_the_tensor(
    released_env, change):
  tmp_path = released_env
  state = {n: tensor_files.open_tensor_file(str(FIXTURE)).read(n)
           for n in tensor_files.open_tensor_file(str(FIXTURE)).infos()}
  orqa = _released_file('orqa', state)
  victim = 'reader/dense_1/kernel'
  if change == 'rename':
    orqa['reader/dense_2/kernel'] = orqa.pop(victim)
  else:
    orqa[victim] = orqa[victim][:-1]
  (tmp_path / 'orqa').mkdir()
  _save_tf(str(tmp_path / 'orqa' / 'model.ckpt'), orqa)
  with pytest.raises(errors.WeightImportError) as error:
    _import(tmp_path, 'bad', sources=[str(tmp_path / 'orqa' / 'model.ckpt')],
            block_emb=str(FIXTURE), corpus_name='bad',
            gin_bindings=importer.hf_bindings([str(FIXTURE)]))
  message = str(error.value)
  assert victim in message
  if change == 'rename':
    assert 'reader/dense_2/kernel' in message and 'missing' in message
  else:
    assert 'mis-shaped' in message
  assert not (tmp_path / 'bad').exists()
