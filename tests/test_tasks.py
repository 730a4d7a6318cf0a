"""The seqio tasks: registered at import, deterministic, reading real data."""

import numpy as np
import pytest
import seqio

import tasks  # pylint: disable=unused-import
from tasks import open_qa as open_qa_tasks
from tests.helpers import DATA_DIR, needs_data

PRETRAIN = [f'realm_pretrain_wiki_leads_{m}' for m in
            ('salient', 'random_uniform', 'random_span')]


@pytest.mark.unit
def test_tasks_are_registered():
  names = set(seqio.TaskRegistry.names())
  assert set(PRETRAIN + ['ict_wiki_leads', 'nq_open', 'web_questions',
                         'curated_trec']) <= names


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
