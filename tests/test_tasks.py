"""The seqio tasks: registered when asked, deterministic, reading real data."""

import numpy as np
import pytest
import seqio

from realm_jax.data import metrics, open_qa
from realm_jax.input import qa_features, tasks
from realm_jax.input.tasks import open_qa as open_qa_tasks
from realm_jax.training import step_inputs
from tests.helpers import DATA_DIR, needs_data

PRETRAIN = [f'realm_pretrain_wiki_leads_{m}' for m in
            ('salient', 'random_uniform', 'random_span')]


@pytest.fixture(autouse=True, scope='module')
def _registered():
  tasks.register()


@pytest.mark.unit
def test_tasks_are_registered_once_however_often_asked():
  names = set(seqio.TaskRegistry.names())
  assert set(PRETRAIN + ['ict_wiki_leads', 'nq_open', 'web_questions',
                         'curated_trec']) <= names
  tasks.register()
  assert set(seqio.TaskRegistry.names()) == names


def _first(name, split, seed, n=4):
  dataset = seqio.get_mixture_or_task(name).get_dataset(
      sequence_length=None, split=split, shuffle=True, seed=seed)
  return [{k: np.asarray(v) for k, v in ex.items()
           if not hasattr(v, 'to_list')} for ex in dataset.take(n)]


@pytest.mark.integration
@pytest.mark.parametrize('name', PRETRAIN + ['ict_wiki_leads'])
def test_corpus_tasks_shuffle_deterministically(name, small_corpus,
                                                monkeypatch):
  monkeypatch.setenv('REALM_CORPUS_DIR', small_corpus)
  a, b, c = (_first(name, 'train', seed) for seed in (1, 1, 2))
  for x, y in zip(a, b):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert [int(x['block_id']) for x in a] != [int(x['block_id']) for x in c]
  for example in a:
    assert example['query_token_ids'][0] == 101  # [CLS]
    if name.endswith(('salient', 'random_span')):
      masked = example['query_token_ids'][example['mlm_positions']]
      assert np.all(masked == 103)  # [MASK]


@pytest.mark.unit
def test_pretraining_without_an_annotated_corpus(tmp_path, monkeypatch):
  monkeypatch.setenv('REALM_CORPUS_DIR', str(tmp_path))
  with pytest.raises(FileNotFoundError, match='realm-jax data annotate'):
    _first(PRETRAIN[0], 'train', 0)


@pytest.mark.integration
@needs_data
@pytest.mark.parametrize('name', ['nq_open', 'web_questions', 'curated_trec'])
def test_qa_tasks_read_the_real_files(name, monkeypatch):
  monkeypatch.setenv('REALM_DATA_DIR', DATA_DIR)
  for split in ('train', 'test'):
    [example] = _first(name, split, seed=0, n=1)
    assert example['query_token_ids'][0] == 101
    assert example['query_token_ids'][-1] == 102
    assert example['question'] and len(example['answers']) >= 1


@pytest.mark.integration
@needs_data
def test_nq_test_has_every_question(monkeypatch):
  monkeypatch.setenv('REALM_DATA_DIR', DATA_DIR)
  dataset = seqio.get_mixture_or_task('nq_open').get_dataset(
      sequence_length=None, split='test', shuffle=False)
  assert sum(1 for _ in dataset) == 3_610


@pytest.mark.unit
def test_targets_are_every_answer():
  example = {'answers': np.array([b'Paris', b'City of Light'])}
  assert open_qa_tasks.answers_postprocessor(
      'x', example=example, is_target=True) == ['Paris', 'City of Light']
  assert open_qa_tasks.answers_postprocessor('Paris') == 'Paris'


def _qa_file(path, rows):
  path.write_text(''.join(f'{q}\t{a!r}\n' for q, a in rows))
  return str(path)


@pytest.mark.unit
def test_a_qa_file_registers_once_under_a_name_of_its_content(tmp_path):
  path = _qa_file(tmp_path / 'My Questions.v2.txt', [('who?', ['me'])])
  name = open_qa_tasks.register_qa_file(path)
  assert name.startswith('qa_file_my_questions_v2_') and len(name) == len(
      'qa_file_my_questions_v2_') + 8
  assert open_qa_tasks.register_qa_file(path) == name  # Idempotent.
  (tmp_path / 'copy').mkdir()
  copy = _qa_file(tmp_path / 'copy' / 'My Questions.v2.txt', [('who?', ['me'])])
  assert open_qa_tasks.register_qa_file(copy) == name
  regex = open_qa_tasks.register_qa_file(path, regex=True)
  assert regex == name.replace('_v2_', '_v2_regex_')
  task = seqio.get_mixture_or_task
  assert task(name).predict_metric_fns == [metrics.exact_match]
  assert task(regex).predict_metric_fns == [metrics.regex_match]
  _qa_file(tmp_path / 'My Questions.v2.txt', [('who?', ['you'])])
  assert open_qa_tasks.register_qa_file(path) not in (name, regex)


@pytest.mark.unit
def test_a_file_of_no_known_format_is_refused_at_registration(tmp_path):
  path = tmp_path / 'notes.txt'
  path.write_text('\nwho wrote hamlet? Shakespeare\n')
  with pytest.raises(ValueError, match=r'notes\.txt:2: not an Open-QA row'):
    open_qa_tasks.register_qa_file(str(path))
  assert not any(name.startswith('qa_file_notes_')
                 for name in seqio.TaskRegistry.names())
  with pytest.raises(FileNotFoundError, match='nowhere.tsv'):
    open_qa_tasks.register_qa_file(str(tmp_path / 'nowhere.tsv'))


@pytest.mark.integration
def test_a_qa_file_task_reads_its_splits(tmp_path):
  rows = [(f'which number is {i}?', [str(i)]) for i in range(60)]
  name = open_qa_tasks.register_qa_file(_qa_file(tmp_path / 'n.tsv', rows))
  read = {split: _first(name, split, seed=0, n=100)
          for split in ('train', 'validation', 'test')}
  assert len(read['test']) == 60
  assert len(read['train']) + len(read['validation']) == 60
  assert read['validation'] and read['train']
  for example in read['test']:
    assert example['query_token_ids'][0] == 101
    assert example['query_token_ids'][-1] == 102
    question = example['question'].item().decode()
    assert [a.decode() for a in example['answers']] == [
        question.split()[-1].rstrip('?')]


@pytest.mark.integration
@pytest.mark.parametrize('length', [96, 64, 20])
def test_a_qa_file_s_questions_read_without_seqio_get_seqio_s_ids(tmp_path,
                                                                  length):
  # What `eval --qa_file` hands the predictor: every question, one cut by
  # the task's 62 wordpieces, some by `length` (which cuts [SEP] too).
  rows = [('who wrote Ōsaka no Ōkami?', ['x']), ('a question', ['y']),
          (' '.join(f'word{i}' for i in range(80)) + '?', ['z'])]
  path = _qa_file(tmp_path / 'q.tsv', rows)
  name = open_qa_tasks.register_qa_file(path)
  evaluator = seqio.Evaluator(
      name, qa_features.QAFeatureConverter(), eval_split='test',
      sequence_length={'query_token_ids': length})
  seqio_ids = np.stack([f['query_token_ids'] for _, f in
                        evaluator.cached_model_datasets[name]
                        .as_numpy_iterator()])
  ids = open_qa.query_token_ids(step_inputs.task_tokenizer(),
                                [q for q, _ in open_qa.load_file(path)],
                                length)
  np.testing.assert_array_equal(ids, seqio_ids)
  assert (ids[-1] != 0).sum() == min(length, open_qa.MAX_QUERY_LENGTH)
