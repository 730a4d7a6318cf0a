"""`realm-jax corpus add/remove/sync`: a corpus changed in place, its index
brought up to date by embedding the added blocks alone."""

import json
import shutil

import gin
import jax
import numpy as np
import pytest
from etils import epath

from realm_jax import errors, main, run_directory
from realm_jax.data import corpus, corpus_changes
from realm_jax.evaluation.prediction import QAPredictor
from realm_jax.index import publication
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index.embed import DocumentEmbedder
from realm_jax.index.refresh import IndexBuilder
from tests.helpers import ARTICLES, bind_tiny, finetuned

# A fact that no block of ARTICLES holds.
QUOKKA = {'title': 'Quokka',
          'text': 'The quokka is a small wallaby that smiles at tourists on '
                  'Rottnest Island near Perth.'}
QUESTION = 'which small wallaby smiles at tourists on Rottnest Island?'


def _write_jsonl(path, articles):
  path.write_text(''.join(json.dumps(a) + '\n' for a in articles))
  return str(path)


@pytest.fixture
def zebra_corpus(tmp_path, tokenizer, monkeypatch):
  monkeypatch.setenv(corpus.CORPUS_ROOT_ENV, str(tmp_path / 'corpora'))
  directory = corpus.corpus_dir('wiki_leads')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[
      _write_jsonl(tmp_path / 'articles.jsonl', ARTICLES)])
  return directory


def _blocks(directory):
  return list(corpus.read_blocks(directory).as_numpy_iterator())


@pytest.mark.integration
def test_added_blocks_are_built_as_build_corpus_builds_them(
    zebra_corpus, tokenizer, tmp_path):
  before = corpus.load_metadata(zebra_corpus)
  extra = _write_jsonl(tmp_path / 'new.jsonl',
                       [QUOKKA, {'title': 'Empty', 'text': ' '}])
  metadata, added = corpus_changes.add_articles(zebra_corpus, tokenizer,
                                                [extra])
  assert added == range(12, 13) and metadata['num_blocks'] == 13
  assert corpus.load_metadata(zebra_corpus) == metadata
  change = metadata['lineage'][-1]
  assert change['change'] == 'add' and change['block_ids'] == [12, 13]
  assert change['base_fingerprint'] == before['corpus_fingerprint']
  assert metadata['corpus_fingerprint'] == change['fingerprint'] != (
      before['corpus_fingerprint'])
  assert change['skipped']['empty article'] == 1
  # The same article built alone gives the same wordpieces.
  alone = str(tmp_path / 'alone')
  corpus.build_corpus(alone, tokenizer, jsonl_paths=[
      _write_jsonl(tmp_path / 'quokka.jsonl', [QUOKKA])])
  new, reference = _blocks(zebra_corpus)[12], _blocks(alone)[0]
  # From a start id, only the new shard is read, and it holds block 12.
  assert [int(b['block_id']) for b in corpus.read_blocks(
      zebra_corpus, 12).as_numpy_iterator()] == [12]
  assert [int(b['block_id']) for b in corpus.read_blocks(
      zebra_corpus, 5).as_numpy_iterator()] == list(range(5, 13))
  assert new['block_id'] == 12 and new['title'] == b'Quokka'
  for field in ('token_ids', 'title_length', 'body', 'sentence_starts'):
    np.testing.assert_array_equal(new[field], reference[field])
  assert corpus_changes.pending_changes(
      metadata, before['corpus_fingerprint']) == [change]
  assert corpus_changes.pending_changes(metadata, 'f' * 64) is None

  titles = tmp_path / 'titles.txt'
  titles.write_text('Animal 3\nNo such title\n')
  metadata, removed = corpus_changes.remove_titles(zebra_corpus, str(titles))
  assert removed == [3]
  assert corpus_changes.removed_ids(metadata).tolist() == [3]
  assert metadata['lineage'][-1]['titles_not_found'] == ['No such title']
  assert len(_blocks(zebra_corpus)) == 13  # Ids never change.
  with pytest.raises(ValueError, match='no block of .* is titled'):
    corpus_changes.remove_titles(zebra_corpus, str(titles))


@pytest.mark.integration
def test_a_killed_add_leaves_the_corpus_as_it_was(zebra_corpus, tokenizer,
                                                  tmp_path, monkeypatch):
  before = corpus.load_metadata(zebra_corpus)

  def killed(*args):
    raise KeyboardInterrupt

  # Killed as metadata.json is replaced, the last write of a change.
  monkeypatch.setattr(type(epath.Path(zebra_corpus)), 'replace', killed)
  with pytest.raises(KeyboardInterrupt):
    corpus_changes.add_articles(zebra_corpus, tokenizer, [
        _write_jsonl(tmp_path / 'new.jsonl', [QUOKKA])])
  assert corpus.load_metadata(zebra_corpus) == before
  assert len(_blocks(zebra_corpus)) == 12


@pytest.mark.integration
def test_a_transaction_killed_at_any_step_is_undone_or_finished(
    zebra_corpus, tokenizer, tmp_path, monkeypatch):
  """An article replaced (removed, then added) on a copy swapped in: killed
  at each copy, rename and removal of the files, the corpus is, once
  `recover` ran, as it was or as replaced, and run again it ends replaced,
  the change made once."""
  titles = tmp_path / 'titles.txt'
  titles.write_text('Animal 3\n')
  quokka = _write_jsonl(tmp_path / 'new.jsonl', [QUOKKA])
  pristine = str(tmp_path / 'pristine')
  shutil.copytree(zebra_corpus, pristine)

  def replace():
    with corpus_changes.transaction(zebra_corpus) as staged:
      corpus_changes.remove_titles(staged, str(titles))
      corpus_changes.add_articles(staged, tokenizer, [quokka])

  class Killed(BaseException):
    """SIGKILL: nothing after it runs, no clean-up either."""

  steps = []
  local = type(epath.Path(zebra_corpus))  # epath's class for local paths.

  def killing(name, real, at):
    def step(*args, **kwargs):
      steps.append(name)
      if len(steps) == at:
        raise Killed(name)
      return real(*args, **kwargs)
    return step

  def attempt(at):
    steps.clear()
    shutil.rmtree(zebra_corpus)
    for left in ('staged', 'replaced'):
      shutil.rmtree(f'{zebra_corpus}.{left}', ignore_errors=True)
    shutil.copytree(pristine, zebra_corpus)
    with monkeypatch.context() as patch:
      for owner, name in ((local, 'rename'), (local, 'rmtree'),
                          (corpus_changes, '_copy_tree')):
        patch.setattr(owner, name, killing(name, getattr(owner, name), at))
      try:
        replace()
      except Killed:
        return steps[-1]
    return None

  before = corpus.load_metadata(pristine)['corpus_fingerprint']
  assert attempt(0) is None
  after = corpus.load_metadata(zebra_corpus)
  assert after['lineage'][-1]['block_ids'] == [12, 13]
  kill_points = len(steps)
  # `recover`'s removal of a copy left, the copy, the new shard's rename,
  # the swap's two renames, the old corpus removed.
  assert steps == ['rmtree', '_copy_tree', 'rename', 'rename', 'rename',
                   'rmtree'], steps
  for at in range(1, kill_points + 1):
    killed_in = attempt(at)
    assert killed_in is not None
    corpus_changes.recover(zebra_corpus)
    fingerprint = corpus.load_metadata(zebra_corpus)['corpus_fingerprint']
    assert fingerprint in (before, after['corpus_fingerprint']), killed_in
    if fingerprint == before:
      replace()
    assert corpus.load_metadata(zebra_corpus) == after, (at, killed_in)
    assert sorted(p.name for p in tmp_path.glob('corpora/*')) == [
        'wiki_leads'], (at, killed_in)


@pytest.mark.slow
@pytest.mark.integration
def test_ask_answers_from_an_added_block_until_it_is_removed(
    zebra_corpus, tmp_path, capsys, monkeypatch):
  """The check of a living corpus, on MiniLM's towers (a fine-tuning run at
  its step 0): the added block, whose fact no other block holds, is
  retrieved first and answers; once removed it is never retrieved. Nothing
  but the added block is embedded."""
  model_dir = str(tmp_path / 'finetune')
  data = tmp_path / 'data' / 'nq_open'
  data.mkdir(parents=True)
  (data / 'topics.nq.dev.txt').write_text(f"{QUESTION}\t['quokka']\n")
  monkeypatch.setenv('REALM_DATA_DIR', str(tmp_path / 'data'))
  main.main(['train', f'--model_dir={model_dir}',
             '--gin_file=gin/runs/finetune.gin',
             '--gin_file=gin/models/minilm_l6.gin',
             '--gin.train.num_steps=1', '--gin.train.batch_size=8',
             '--gin.bert_adamw.warmup_steps=0',
             '--gin.Finetune.query_length=24',
             '--gin.Finetune.num_candidates=3',
             '--gin.build_realm.reader_length=96'])
  index = lambda: publication.index_manager(
      run_directory.index_dir(model_dir), read_only=True)
  before = publication.read_embeddings(index(), 0)

  gin.clear_config()
  main.main(['corpus', 'add', f'--model_dir={model_dir}',
             f'--jsonl={_write_jsonl(tmp_path / "new.jsonl", [QUOKKA])}'])
  out = capsys.readouterr().out
  assert 'blocks 12-12 added' in out and 'index step 1 published' in out
  assert run_directory.reload(index())[-1] == 1
  after = publication.read_embeddings(index(), 1)
  np.testing.assert_array_equal(after[:12], before)  # Not embedded again.
  metadata = publication.read_metadata(index(), 1)
  assert metadata['params_step'] == 0
  assert metadata['synced_from']['step'] == 0
  assert metadata['synced_from']['base_fingerprint'] == publication.\
      read_metadata(index(), 0)['corpus_fingerprint']
  assert [c['change'] for c in metadata['synced_from']['changes']] == ['add']
  assert metadata['corpus_fingerprint'] == corpus.load_metadata(
      zebra_corpus)['corpus_fingerprint']
  # The new row is the embedding of the new block by the towers of step 0,
  # which embedded the rest, not by those of step 1.
  run = QAPredictor(model_dir)
  expected = DocumentEmbedder(run.run.retriever(), 8)(
      run_directory.restore_params(model_dir, 0)[1]['retriever'],
      OpenCorpus(zebra_corpus).padded(metadata['block_length'], 12, 13))
  np.testing.assert_allclose(after[12], np.asarray(expected)[0], rtol=1e-4,
                             atol=1e-5)

  result = run.ask(QUESTION)
  assert result['blocks'][0]['title'] == 'Quokka'
  best = run.predict(run.query([QUESTION], run.query_length))[0]['answers'][0]
  assert 12 in best.per_block

  gin.clear_config()
  (tmp_path / 'titles.txt').write_text('Quokka\n')
  main.main(['corpus', 'remove', f'--model_dir={model_dir}',
             f'--titles={tmp_path / "titles.txt"}'])
  assert 'index step 2 published (0 block(s) embedded in 0.0 s)' in (
      capsys.readouterr().out)
  gin.clear_config()
  run = QAPredictor(model_dir, top_k=12)  # Every live block.
  retrieved = run.predict(run.query([QUESTION], run.query_length))[0]
  assert sorted(retrieved['block_ids']) == list(range(12))
  assert all(12 not in a.per_block for a in retrieved['answers'])
  jax.clear_caches()


@pytest.mark.integration
@pytest.mark.slow
def test_trainer_and_builder_restart_on_a_changed_corpus(zebra):
  """After `corpus add` and `remove`, a resumed run trains with the synced
  index, and an index builder started afresh embeds its next checkpoint:
  every block of the changed corpus, the removed one never served."""
  model_dir = finetuned(zebra)  # Steps 0-2; index step 0.
  gin.clear_config()
  main.main(['corpus', 'add', f'--model_dir={model_dir}',
             f'--jsonl={_write_jsonl(zebra / "new.jsonl", [QUOKKA])}'])
  gin.clear_config()
  (zebra / 'titles.txt').write_text('Animal 3\n')
  main.main(['corpus', 'remove', f'--model_dir={model_dir}',
             f'--titles={zebra / "titles.txt"}'])
  gin.clear_config()
  finetuned(zebra, '--gin.train.num_steps=4')
  assert run_directory.restore_params(model_dir)[0] == 4

  gin.clear_config()
  bind_tiny()
  builder = IndexBuilder(model_dir, OpenCorpus(corpus.corpus_dir('wiki_leads')))
  assert builder.last == 2  # The index of the second change.
  assert builder.poll() == 'published' and builder.last == 4
  assert publication.read_embeddings(builder.index, 4).shape[0] == 13
  gin.clear_config()
  run = QAPredictor(model_dir, top_k=12)  # Every live block.
  assert run.retrieval.client.index_step == 4
  retrieved = run.predict(run.query([QUESTION], run.query_length))[0]
  assert sorted(retrieved['block_ids']) == [i for i in range(13) if i != 3]


@pytest.mark.integration
def test_an_index_from_before_a_change_is_refused_naming_both(
    zebra_corpus, tokenizer, tmp_path):
  metadata = corpus.load_metadata(zebra_corpus)
  old = publication.index_metadata(metadata, np.zeros((12, 4), np.float32), 0,
                                   'exact')
  changed, _ = corpus_changes.add_articles(zebra_corpus, tokenizer, [
      _write_jsonl(tmp_path / 'new.jsonl', [QUOKKA])])
  with pytest.raises(errors.IndexMismatchError) as error:
    publication.check_compatible(old, changed, 4, 'index/0')
  message = str(error.value)
  assert metadata['corpus_fingerprint'] in message
  assert changed['corpus_fingerprint'] in message
  assert 'realm-jax corpus sync' in message
