"""`realm-jax import` of Google's released REALM, against Hugging Face's port.

The fixture (tests/fixtures/released/orqa_tiny) is a tiny RealmForOpenQA with
random weights in the released Hugging Face layout, with what transformers
4.57.6 computed on it. The import must reproduce that computation: the query
embeddings, the retrieval, the reader's span logits and the predicted answer.
The same weights written in the TensorFlow layouts (ORQA's checkpoint, the
TF-Hub modules) must import to the same parameters.
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
from realm_jax.released import importer, layouts, tensor_files
from realm_jax.training import run_loader
from tasks import common

pytestmark = pytest.mark.integration

FIXTURE = pathlib.Path(__file__).parent / 'fixtures' / 'released' / 'orqa_tiny'
EXPECTED = np.load(FIXTURE / 'expected.npz')
QUESTIONS = json.loads((FIXTURE / 'expected.json').read_text())['questions']
TOLERANCE = {'rtol': 1e-5, 'atol': 1e-5}


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


def _tf_names(state: dict, layout: layouts.Layout, model) -> dict:
  """The fixture's weights renamed (and transposed) into `layout`."""
  hf = layouts.LAYOUTS[[l.name for l in layouts.LAYOUTS].index('hf_openqa')]
  out = {}
  ours = {t.path: (name, t) for name, tensors in
          layouts.expected_names(hf, model).items() for t in tensors}
  for name, tensors in layouts.expected_names(layout, model).items():
    source_name, tensor = ours[tensors[0].path]
    value = state[source_name]
    out[name] = value.T if tensor.in_ndim is not None else value
  return out


def _save_tf(prefix: str, tensors: dict) -> None:
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(tensors),
                    shape_and_slices=[''] * len(tensors),
                    tensors=[tf.constant(v) for v in tensors.values()])


def _write_tfrecord(path, texts):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for text in texts:
      writer.write(text.encode('utf-8'))


def test_tensorflow_layouts_import_the_same_weights(released_env):
  tmp_path = released_env
  reference = _import(tmp_path, 'hf')
  model, hf_params = _loaded(reference['model_dir'])
  state = {n: tensor_files.open_tensor_file(str(FIXTURE)).read(n)
           for n in tensor_files.open_tensor_file(str(FIXTURE)).infos()}
  by_name = {l.name: l for l in layouts.LAYOUTS}
  orqa = _tf_names(state, by_name['orqa'], model)
  orqa['global_step'] = np.int64(300000)
  orqa['reader/dense/kernel/adam_m'] = orqa['reader/dense/kernel']
  (tmp_path / 'orqa').mkdir()
  _save_tf(str(tmp_path / 'orqa' / 'model.ckpt-300000'), orqa)
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
  _, tf_params = _loaded(summary['model_dir'])
  jax.tree.map(np.testing.assert_array_equal, tf_params, hf_params)

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
  for layout, name in (('hub_embedder', 'embedder'), ('hub_bert', 'bert')):
    (tmp_path / name / 'variables').mkdir(parents=True)
    _save_tf(str(tmp_path / name / 'variables' / 'variables'),
             _tf_names(state, by_name[layout], model))
  pre = _import(tmp_path, 'pretrained',
                sources=[str(tmp_path / 'embedder'), str(tmp_path / 'bert')],
                block_emb=str(tmp_path / 'encoded' / 'encoded.ckpt'),
                blocks=str(tmp_path / 'blocks.tfr'),
                titles=str(tmp_path / 'titles.tfr'), corpus_name='pre',
                gin_bindings=bindings)
  assert pre['kind'] == 'Pretrain'
  _, pre_params = _loaded(pre['model_dir'])
  jax.tree.map(np.testing.assert_array_equal, pre_params['retriever'],
               hf_params['retriever'])
  jax.tree.map(np.testing.assert_array_equal, pre_params['reader']['bert'],
               hf_params['reader']['bert'])


@pytest.mark.parametrize('change', ['rename', 'reshape'])
def test_a_file_that_does_not_fit_is_refused_naming_the_tensor(
    released_env, change):
  tmp_path = released_env
  model, _ = _loaded(_import(tmp_path, 'hf')['model_dir'])
  state = {n: tensor_files.open_tensor_file(str(FIXTURE)).read(n)
           for n in tensor_files.open_tensor_file(str(FIXTURE)).infos()}
  orqa = _tf_names(state, layouts.LAYOUTS[0], model)
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
