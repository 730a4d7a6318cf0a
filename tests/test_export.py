"""`realm-jax export`: each part loaded by the tool users load it with
(sentence-transformers, transformers, FAISS) gives what realm-jax gives,
and `realm-jax import --export` reads it back into the same run."""

import json
import os
import shutil
import time

import gin
import numpy as np
import pytest

from realm_jax import errors, main, run_directory
from realm_jax.data import block_store, corpus, wordpiece
from realm_jax.evaluation import masked_lm, prediction
from realm_jax.export import card, hf_tensors, tokenizer_json, writer
from realm_jax.index import publication
from realm_jax.models import bert, candidates
from realm_jax.models.bert import BertConfig
from realm_jax.models.retriever import Retriever
from realm_jax.training import run_loader, step_inputs
from tests.helpers import REPO, flip_a_bit, train_tiny, unchanged

QUESTIONS = ['who wrote the origin of species?', 'capital of France',
             'Straße in São Paulo', 'ς and σ…', 'zebra crossings']
# Scores this close are a tie: the two sides' embeddings differ by 1e-6.
TIE = 1e-4


def _embedded_copy(run_dir: str, into) -> str:
  """A copy of `run_dir` with an index of its newest step."""
  copy = str(into / 'run')
  shutil.copytree(run_dir, copy)
  gin.clear_config()  # What a training run left bound.
  # The run's config.gin says which towers: no gin flag is given.
  main.main(['embed', f'--model_dir={copy}'])
  return copy


@pytest.fixture(scope='module')
def exported(tmp_path_factory, trained_pretraining, small_corpus):
  """(the tiny pre-training run, its export); REALM_CORPUS_DIR set."""
  root = tmp_path_factory.mktemp('export')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('REALM_CORPUS_DIR', small_corpus)
    run_dir = _embedded_copy(trained_pretraining, root)
    output = str(root / 'export')
    writer.export(run_dir, output)
    for _ in unchanged(str(root), 'run and export'):
      yield run_dir, output


def _same_blocks(ours: dict, score, row, k: int) -> int:
  """Asserts FAISS's top `k` (`score`, `row`: k + 1 of them) are
  realm-jax's, ties aside: a rank whose score is within TIE of a
  neighbour's (the (k + 1)th's included) may hold either block. Returns
  the ranks compared."""
  np.testing.assert_allclose(score[:k], ours['retrieval_scores'], atol=1e-4)
  apart = np.abs(np.diff(score, prepend=np.inf)) > TIE
  kept = apart[:k] & apart[1:k + 1]
  assert list(row[:k][kept]) == list(np.asarray(ours['block_ids'])[kept])
  return int(kept.sum())


def _retriever(run_dir):
  loaded = run_loader.load_run(run_dir)
  towers = writer.Towers.of(loaded.run)
  _, params = run_directory.restore_params(run_dir, None, ('retriever',))
  module = Retriever(towers.config, towers.projection_size,
                     towers.share_towers, towers.pooling)
  return loaded, module, params['retriever']


def _sentence_transformer(path):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  return SentenceTransformer(path, device='cpu')


@pytest.mark.integration
def test_towers_give_realm_jax_embeddings(exported, small_corpus):
  run_dir, output = exported
  loaded, retriever, params = _retriever(run_dir)
  q = step_inputs.task_tokenizer().numpy_join(QUESTIONS, max_length=64)
  ours = retriever.apply({'params': params}, q['token_ids'], q['input_mask'],
                         q['token_type_ids'], method='embed_query')
  theirs = _sentence_transformer(os.path.join(output, 'query_encoder')).encode(
      QUESTIONS)
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
  store = block_store.open_store(corpus.corpus_dir('wiki_leads'))
  pairs = [(store.title(i), store.body(i)) for i in range(store.num_blocks)]
  documents = _sentence_transformer(os.path.join(output, 'document_encoder'))
  index = publication.read_embeddings(publication.index_manager(
      run_directory.index_dir(run_dir), read_only=True), loaded.index_step)
  np.testing.assert_allclose(documents.encode(pairs), index, atol=1e-4,
                             rtol=0)
  manifest = json.loads(open(os.path.join(output, 'manifest.json')).read())
  assert manifest['run']['step'] == manifest['index']['params_step'] == 2


@pytest.mark.integration
def test_faiss_finds_the_blocks_realm_jax_search_finds(exported):
  import faiss  # pylint: disable=g-import-not-at-top
  run_dir, output = exported
  k = 20
  predictor = prediction.QAPredictor(run_dir, top_k=k, read=False)
  ours = predictor.predict(predictor.query(QUESTIONS, predictor.query_length))
  index = faiss.read_index(os.path.join(output, 'index', 'index'))
  ids = open(os.path.join(output, 'index', 'docid')).read().split()
  queries = _sentence_transformer(os.path.join(output, 'query_encoder'))
  scores, rows = index.search(queries.encode(QUESTIONS), k + 1)
  for result, score, row in zip(ours, scores, rows):
    _same_blocks(result, score, row, k)
  blocks = [json.loads(line) for line in open(
      os.path.join(output, 'index', 'blocks.jsonl'))]
  assert [b['id'] for b in blocks] == ids and blocks[0]['title']


@pytest.mark.integration
def test_the_reader_is_a_bert_for_masked_lm(exported):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import BertForMaskedLM, pipeline  # pylint: disable=g-import-not-at-top
  run_dir, output = exported
  loaded = run_loader.load_run(run_dir)
  model = loaded.run.objective.model
  _, params = run_directory.restore_params(run_dir, None, ('retriever',
                                                           'reader'))
  tokenizer = step_inputs.task_tokenizer()
  query = tokenizer.numpy_join(['the zebra has black and white stripes'],
                               max_length=32)
  positions = np.array([[2, 6]], np.int32)
  query['token_ids'][0, positions[0]] = tokenizer.mask_id
  null = candidates.null_document(32, tokenizer.cls_id,
                                  tokenizer.sep_id)
  blocks = {key: np.asarray(value)[None, None] for key, value in null.items()}
  inputs = model.apply({'params': params}, query, blocks,
                       method=type(model).reader_inputs)
  ours = model.apply({'params': params}, inputs, positions,
                     method=lambda m, i, p: m.reader.masked_lm_logits(i, p))
  reader = BertForMaskedLM.from_pretrained(os.path.join(output, 'reader'))
  tensor = lambda key: torch.tensor(np.asarray(inputs[key])[0], dtype=torch.long)
  with torch.no_grad():
    theirs = reader(input_ids=tensor('token_ids'),
                    token_type_ids=tensor('token_type_ids'),
                    attention_mask=tensor('input_mask')).logits
  np.testing.assert_allclose(theirs[0, positions[0]].numpy(),
                             np.asarray(ours)[0, 0], atol=1e-4, rtol=0)
  fill = pipeline('fill-mask', model=os.path.join(output, 'reader'),
                  device='cpu')
  assert len(fill('the zebra has black and [MASK] stripes.')) == 5


@pytest.mark.integration
def test_export_then_import_gives_the_same_run(exported, tmp_path):
  run_dir, output = exported
  back = str(tmp_path / 'back')
  main.main(['import', f'--export={output}', f'--model_dir={back}'])
  _, before = run_directory.restore_params(run_dir, None, ('retriever',
                                                           'reader'))
  step, after = run_directory.restore_params(back, None, ('retriever',
                                                          'reader'))
  assert step == 2
  exported_parts = {'retriever': before['retriever'], 'reader': {
      k: v for k, v in before['reader'].items() if k != 'span_head'}}
  for path, value in _leaves(exported_parts):
    np.testing.assert_array_equal(_at(after, path), value, err_msg=path)
  scored = lambda d: {k: v for k, v in masked_lm.evaluate(
      d, str(tmp_path / f'{os.path.basename(d)}_eval')).items()
                       if 'dir' not in k}
  assert scored(back) == scored(run_dir)


def _leaves(tree, path=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, path + (key,))
    else:
      yield path + (key,), value


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return tree


@pytest.mark.integration
def test_what_cannot_be_exported_stops_with_one_line_and_leaves_nothing(
    exported, tmp_path, monkeypatch, capsys):
  run_dir, output = exported
  with pytest.raises(errors.BadConfig, match='exists'):
    writer.export(run_dir, output)
  unindexed = str(tmp_path / 'unindexed')
  shutil.copytree(run_dir, unindexed)
  shutil.rmtree(run_directory.index_dir(unindexed))
  with pytest.raises(errors.NotFound, match='no published index') as raised:
    writer.export(unindexed, str(tmp_path / 'out'))
  # The project's errors: what is wrong on one line, what to do on the next.
  assert len(str(raised.value).splitlines()) == 2
  damaged = str(tmp_path / 'damaged')
  shutil.copytree(run_dir, damaged)
  data = os.path.join(run_directory.checkpoints_dir(damaged), '2',
                      'retriever_params', 'ocdbt.process_0', 'd')
  for name in os.listdir(data):
    flip_a_bit(os.path.join(data, name))
  with pytest.raises(errors.DamagedStepError, match='is damaged') as raised:
    writer.export(damaged, str(tmp_path / 'out'))
  assert '\n' not in str(raised.value)

  def broken(*_):
    raise RuntimeError('disk full')
  monkeypatch.setattr(writer, 'index', broken)
  with pytest.raises(RuntimeError, match='disk full'):
    writer.export(run_dir, str(tmp_path / 'out'))
  assert sorted(os.listdir(tmp_path)) == ['damaged', 'unindexed']
  # A damaged export is refused by import, naming the file.
  copy = str(tmp_path / 'copy')
  shutil.copytree(output, copy)
  with open(os.path.join(copy, 'reader', 'config.json'), 'a') as f:
    f.write(' ')
  assert main.main(['import', f'--export={copy}',
                    f'--model_dir={tmp_path / "back"}']) == 2
  assert ('reader/config.json is damaged: its sha256 is not the one the '
          'manifest lists' in capsys.readouterr().err)
  assert not os.path.exists(tmp_path / 'back')


@pytest.mark.integration
@pytest.mark.slow
def test_an_ict_run_exports_its_towers_and_comes_back(small_corpus_env,
                                                      tmp_path):
  trained = str(tmp_path / 'ict')
  train_tiny(trained, 'ict', "--gin.Ict.bert_dir=''", '--gin.train.num_steps=2')
  run_dir = _embedded_copy(trained, tmp_path)
  output = str(tmp_path / 'export')
  manifest = writer.export(run_dir, output)
  assert manifest['parts'] == ['query_encoder', 'document_encoder', 'index']
  loaded, _, _ = _retriever(run_dir)
  index = publication.read_embeddings(publication.index_manager(
      run_directory.index_dir(run_dir), read_only=True), loaded.index_step)
  store = block_store.open_store(corpus.corpus_dir('wiki_leads'))
  pairs = [(store.title(i), store.body(i)) for i in range(store.num_blocks)]
  np.testing.assert_allclose(_sentence_transformer(os.path.join(
      output, 'document_encoder')).encode(pairs), index, atol=1e-4, rtol=0)
  back = str(tmp_path / 'back')
  main.main(['import', f'--export={output}', f'--model_dir={back}'])
  _, before = run_directory.restore_params(run_dir, None, ('retriever',))
  _, after = run_directory.restore_params(back, None, ('retriever',))
  for path, value in _leaves(before):
    np.testing.assert_array_equal(_at(after, path), value, err_msg=path)


@pytest.mark.unit
@pytest.mark.parametrize('scan', [False, True])
def test_bert_and_heads_go_out_and_back_exactly(tiny_config, scan):
  import jax  # pylint: disable=g-import-not-at-top
  config = BertConfig(**{**vars(tiny_config), 'scan_layers': scan})
  ones = np.ones((1, 8), np.int32)
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  params = nn.meta.unbox(bert.Bert(config).init(jax.random.key(0), ones, ones,
                                                ones))['params']
  params = jax.tree.map(np.asarray, params)
  arrays = hf_tensors.bert_to_hf(params, config)
  assert arrays['encoder.layer.1.attention.self.query.weight'].shape == (32, 32)
  back = hf_tensors.bert_from_hf(arrays, config)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  rng = np.random.default_rng(0)
  span = {name: {k: rng.normal(size=v.shape).astype(np.float32)
                 for k, v in tree.items()} for name, tree in {
      'start': {'kernel': np.zeros((32, 8)), 'bias': np.zeros(8)},
      'end': {'kernel': np.zeros((32, 8)), 'bias': np.zeros(8)},
      'score': {'kernel': np.zeros((8, 1)), 'bias': np.zeros(1)},
      'layer_norm': {'scale': np.zeros(8), 'bias': np.zeros(8)}}.items()}
  tensors = hf_tensors.span_head_tensors(32, 8)
  jax.tree.map(np.testing.assert_array_equal,
               hf_tensors.from_hf(tensors, hf_tensors.to_hf(tensors, span)),
               span)


@pytest.mark.unit
def test_the_tokenizer_file_reads_text_as_our_wordpiece_does():
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  ours = step_inputs.task_tokenizer()
  theirs = Tokenizer.from_str(json.dumps(tokenizer_json.tokenizer_json(
      ours.vocab_path)))
  texts = ['Straße', 'Σίσυφος', 'naïve café', 'ﬁne…', 'soft\u00adhyphen',
           'zero\u200bwidth', 'tab\tand\x01control', '北京大学 and 東京',
           'Ǆemal İstanbul', 'µ ſ ϐ', 'मैं हिंदी', 'emoji 🦓 done',
           "don't stop-me (now)!"]
  for text in texts:
    want = ours.numpy_join([text], max_length=48)['token_ids'][0]
    got = theirs.encode(text).ids
    assert got == [i for i in want if i], text
  assert wordpiece.MAX_BYTES_PER_WORD == 100


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_runs_export_as_realm_jax_retrieves(tmp_path, monkeypatch):
  """After `make demo`: its ICT and REALM runs, every block and the 3,610
  NQ test questions, and the time an export takes."""
  demo = os.path.join(REPO, 'runs', 'demo')
  questions = os.path.join(REPO, '..', 'shared', 'data', 'nq_open',
                           'topics.nq.test.txt')
  if not (os.path.isdir(os.path.join(demo, 'realm', 'index'))
          and os.path.exists(questions)):
    pytest.skip('no demo runs (make demo) or no NQ test questions here')
  monkeypatch.setenv('REALM_CORPUS_DIR', os.path.join(REPO, 'runs',
                                                      'corpora'))
  import faiss  # pylint: disable=g-import-not-at-top
  texts = [line.split('\t')[0] for line in open(questions, encoding='utf-8')]
  for name in ('ict', 'realm'):
    output = str(tmp_path / name)
    started = time.perf_counter()
    writer.export(os.path.join(demo, name), output)
    seconds = time.perf_counter() - started
    assert seconds < 30
    predictor = prediction.QAPredictor(os.path.join(demo, name), top_k=20,
                                       read=False)
    ours = predictor.predict(predictor.query(texts, predictor.query_length))
    embedded = _sentence_transformer(os.path.join(output, 'query_encoder')
                                     ).encode(texts, batch_size=256)
    scores, rows = faiss.read_index(os.path.join(output, 'index', 'index')
                                    ).search(embedded, 21)
    compared = sum(_same_blocks(result, score, row, 20)
                   for result, score, row in zip(ours, scores, rows))
    loaded = run_loader.load_run(os.path.join(demo, name))
    index = publication.read_embeddings(publication.index_manager(
        run_directory.index_dir(loaded.model_dir), read_only=True),
                                        loaded.index_step)
    store = block_store.open_store(corpus.corpus_dir('wiki_leads'))
    documents = _sentence_transformer(os.path.join(
        output, 'document_encoder')).encode(
            [(store.title(i), store.body(i)) for i in range(store.num_blocks)],
            batch_size=256)
    worst = float(np.abs(documents - index).max())
    print(f'{name}: export {seconds:.1f} s; top-20 of {len(texts):,} '
          f'questions, {compared:,} of {20 * len(texts):,} ranks compared '
          f'(the rest ties); {store.num_blocks:,} blocks within {worst:.1e}')
    assert worst <= 1e-4


@pytest.mark.unit
def test_the_card_gives_the_settings_of_the_config_and_the_builders_cadence():
  """The builder's cadence is the run's record's: the trainer's operative
  config never holds it."""
  config = 'train.num_steps = 100\nPretrain.masking = \'salient\'\n'
  record = {'refresh': {'refresh_interval_steps': 10, 'stale_factor': None}}
  assert card.settings(config, record) == [
      ('train.num_steps', '100'), ('Pretrain.masking', "'salient'"),
      ('run_refresh.refresh_interval_steps', '10')]
  assert card.settings(config, None) == card.settings(config, {})[:2]
