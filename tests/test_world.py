"""The controlled knowledge world: its generator, its refusals, and REALM
learning in it through the real trainer and index builder."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from realm_jax import default_files, errors
from realm_jax.data import world
from realm_jax.data.tokenization import WordPieceTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = world.WorldSpec(people=60, no_document=5, edited=5, first_names=6,
                        last_names=12)


@pytest.fixture(scope='module')
def tokenizer():
  return WordPieceTokenizer(default_files.task_vocab())


@pytest.mark.unit
def test_every_value_is_one_wordpiece(tokenizer):
  for attribute, values in world.VALUES.items():
    pieces = {v: tokenizer.encode([v])[0] for v in values}
    assert all(len(p) == 1 for p in pieces.values()), (attribute, pieces)
    assert len(set(values)) == len(values)


@pytest.mark.unit
def test_the_same_seed_makes_the_same_world_and_another_seed_another():
  a, b = world.World(SMALL), world.World(SMALL)
  assert a.documents() == b.documents()
  assert a.queries('held_out') == b.queries('held_out')
  other = world.World(dataclasses.replace(SMALL, seed=1))
  assert other.documents() != a.documents()


@pytest.mark.unit
def test_the_world_holds_what_the_spec_says():
  the_world = world.World(SMALL)
  splits = [p.split for p in the_world.people]
  held_out = round(SMALL.people * SMALL.held_out_share)
  assert splits.count('held_out') == held_out
  assert splits.count('train') == SMALL.people - held_out
  assert splits.count('no_document') == SMALL.no_document
  names = [p.name for p in the_world.people]
  assert len(set(names)) == len(names)
  assert len(the_world.documents()) == SMALL.people
  for person in the_world.people[:10]:
    if person.split == 'no_document':
      continue
    text = the_world.document(person)['text']
    # Its facts, and the people it names, all in the document.
    assert all(value in text for value in person.facts.values())
    assert all(name in text for name in person.mentions)
  queries = the_world.queries('train')
  assert len(queries) == (SMALL.people - held_out) * len(SMALL.attributes) * 2
  for query in queries[:20]:
    assert query.text[query.start:query.end] == query.value
  edits = the_world.edits()
  assert len(edits) == SMALL.edited
  people = {p.name: p for p in the_world.people}
  for name, facts in edits.items():
    assert people[name].split == 'held_out'
    assert all(people[name].facts[a] != v for a, v in facts.items())


@pytest.mark.unit
def test_a_query_masks_its_value_and_names_its_document(tokenizer):
  the_world = world.World(SMALL)
  query = the_world.queries('held_out')[0]
  [row] = world.query_arrays([query], tokenizer, {query.person: 7}, 24, 2)
  ids = row['query_token_ids']
  assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
  assert [ids[p] for p in row['mlm_positions']] == [tokenizer.mask_id]
  assert tokenizer.decode(row['mlm_targets']) == query.value
  assert row['block_id'] == 7
  with pytest.raises(errors.BadConfig, match='Pretrain.query_length'):
    world.query_arrays([query], tokenizer, {}, 5, 2)


@pytest.mark.unit
def test_the_world_vocabulary_tokenizes_every_text_as_bert_does(tokenizer,
                                                                tmp_path):
  """Every document (edited ones too) and query of a world, of every
  attribute and both phrasings, reads as the same wordpieces in the world's
  512 as in BERT's 30,522; the special tokens keep their roles."""
  own = WordPieceTokenizer(world.write_vocabulary(str(tmp_path / 'v.txt')))
  assert own.vocab_size == world.VOCAB_SIZE
  assert (own.pad_id, own.first_regular_id) == (0, 5)
  the_world = world.World(dataclasses.replace(
      SMALL, attributes=tuple(world.VALUES), values=20, first_names=240,
      last_names=240, people=100, edited=20))
  people = {p.name: p for p in the_world.people}
  texts = [f'{d["title"]} {d["text"]}' for d in the_world.documents()]
  texts += [f'{d["title"]} {d["text"]}' for d in (
      the_world.document(people[n], {**people[n].facts, **facts})
      for n, facts in the_world.edits().items())]
  texts += [q.text for split in world.SPLITS
            for q in the_world.queries(split)]
  # Every name part and value, whichever people a seed draws.
  texts += [f'{s}{e} {v}' for s in world.NAME_STARTS for e in world.NAME_ENDS
            for v in ('paris', '1931')]
  texts += [v for values in world.VALUES.values() for v in values]
  spelled = lambda t, ids: [t.vocab[i] for i in ids]
  for text in texts:
    assert (spelled(own, own.encode([text])[0])
            == spelled(tokenizer, tokenizer.encode([text])[0])), text
  with pytest.raises(errors.BadInput, match="'Zebras play.' has wordpieces"):
    world.check_covered(own, ['The city of Paris.', 'Zebras play.'])


@pytest.mark.unit
def test_a_model_smaller_than_the_vocabulary_is_refused(monkeypatch):
  """The world's BERTs hold 512 wordpieces: read with BERT's vocabulary,
  ids past 512 would be clamped silently."""
  from realm_jax.training import run_loader  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(default_files.VOCAB_ENV, raising=False)
  monkeypatch.chdir(REPO)
  run_loader.configure(['gin/runs/pretrain.gin', 'gin/setups/world.gin'], [])
  with pytest.raises(errors.BadConfig,
                     match=r'vocab_size=512, .* has 30522 wordpieces'):
    run_loader.configured_run()


@pytest.mark.unit
@pytest.mark.parametrize('change, message', [
    ({'people': 5000}, 'exceeds the 2400 distinct names'),
    ({'values': 0}, 'values=0'),
    ({'held_out_share': 0.0}, 'held_out_share=0.0'),
    ({'held_out_share': 1.0}, 'held_out_share=1.0'),
    ({'attributes': ()}, 'attributes is empty'),
    ({'attributes': ('height',)}, "attributes ['height'] unknown"),
    ({'edited': 10_000}, 'edited=10000'),
])
def test_an_impossible_world_is_refused(change, message):
  with pytest.raises(errors.BadConfig, match=message.replace('[', r'\[')):
    world.World(dataclasses.replace(world.WorldSpec(), **change))


@pytest.mark.integration
def test_the_command_refuses_an_impossible_world_in_one_line(tmp_path):
  env = {**os.environ, 'REALM_CORPUS_DIR': str(tmp_path / 'corpora'),
         'REALM_ARRAYS_DIR': str(tmp_path / 'arrays')}
  result = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'data', 'world',
       '--held_out_share=1', '--values=0'], capture_output=True, text=True,
      env=env, check=False)
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.splitlines() if 'World spec' in l]
  assert len(lines) == 1 and 'held_out_share=1.0' in lines[0]
  assert 'values=0' in lines[0]
  assert 'Traceback' not in result.stderr
  assert not (tmp_path / 'corpora').exists()


@pytest.mark.integration
@pytest.mark.slow
def test_two_writes_give_the_same_corpus_fingerprint(tmp_path, monkeypatch):
  from realm_jax.experiments import world_demo  # pylint: disable=g-import-not-at-top
  fingerprints = []
  monkeypatch.setenv(default_files.VOCAB_ENV, world.write_vocabulary(
      str(tmp_path / 'vocab.txt')))
  for attempt in ('a', 'b'):
    monkeypatch.setenv('REALM_CORPUS_DIR', str(tmp_path / attempt))
    monkeypatch.setenv('REALM_ARRAYS_DIR', str(tmp_path / attempt / 'arrays'))
    fingerprints.append(world_demo.make_world(SMALL)['corpus_fingerprint'])
  assert fingerprints[0] == fingerprints[1]
  arrays = [np.load(tmp_path / a / 'arrays' / 'realm_pretrain_world_salient' /
                    'train' / 'query_token_ids.npy') for a in 'ab']
  np.testing.assert_array_equal(*arrays)


def _scored(correct, hits):
  """One scoring's rows of four queries (block i is query i's)."""
  return [{'key': f'q{i}', 'block_id': i, 'masked_tokens': 1,
           'correct_tokens': c, 'log_likelihood': -1.0 + c,
           'top1_block_id': i if h else i + 1}
          for i, (c, h) in enumerate(zip(correct, hits))]


@pytest.mark.unit
def test_scorings_along_a_run_are_averaged_per_query_then_compared():
  from realm_jax.experiments import world_demo  # pylint: disable=g-import-not-at-top
  # The fresh run right at every step; the stale one wrong on all four
  # queries at one step of two, then recovered: as much as right half the
  # time, though its last step alone ties.
  fresh = world_demo.averaged([_scored([1, 1, 1, 1], [1, 1, 1, 1])] * 2)
  stale = world_demo.averaged([_scored([0, 0, 0, 0], [0, 0, 1, 1]),
                               _scored([1, 1, 1, 1], [1, 1, 1, 1])])
  assert [r['correct_tokens'] for r in stale] == [0.5] * 4
  assert [r['hit'] for r in stale] == [0.5, 0.5, 1.0, 1.0]
  compared = world_demo.compare_along(fresh, stale)
  assert compared['masked_token_accuracy']['difference'] == 50.0
  assert compared['recall@1']['difference'] == 25.0
  assert compared['log_likelihood']['difference'] == pytest.approx(0.5)
  with pytest.raises(ValueError, match='different queries'):
    world_demo.averaged([_scored([1] * 4, [1] * 4),
                         _scored([1] * 3, [1] * 3)])


@pytest.mark.unit
@pytest.mark.parametrize('name', ['world_pdist'])
def test_a_signal_preset_trains_every_retriever_of_the_world_by_it(name):
  """REALM and its frozen control by the signal its name says; the runs
  that read the null document alone, and the warm starts, by nothing else."""
  from realm_jax.experiments import preset as preset_lib  # pylint: disable=g-import-not-at-top
  spec = preset_lib.load(name)
  signal = name.removeprefix('world_')
  bound = {stage.name: stage.args['bindings'].get('retriever_signal.name')
           for stage in spec.stages if 'bindings' in stage.args}
  assert bound == {'ict': None, 'reader': None, 'pretrain_realm': signal,
                   'pretrain_baseline': None, 'pretrain_frozen': signal,
                   'pretrain_start': None}
  assert spec.sizes == {**preset_lib.load('world').sizes, 'ablations': False}


@pytest.mark.unit
@pytest.mark.parametrize('steps', [30, 2])
def test_a_preset_not_scored_at_whole_quarters_is_refused(steps):
  from realm_jax.experiments.presets import _world  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=f'pretrain_steps={steps} must be'):
    _world.preset(SMALL, _world.Sizes(ict_steps=1, reader_steps=1,
                                      pretrain_steps=steps,
                                      refresh_interval=5))


@pytest.mark.unit
@pytest.mark.parametrize('name', ['world', 'world_small', 'world_top3',
                                  'world_warmup30', 'world_pdist'])
def test_each_run_saves_what_its_builder_and_its_scoring_read(name):
  """A run with an index builder saves its towers at every refresh step
  (as a snapshot or a whole checkpoint), and a whole checkpoint at every
  step scored along it; a run without one saves its last step alone."""
  from realm_jax.experiments import preset as preset_lib  # pylint: disable=g-import-not-at-top
  spec = preset_lib.load(name)
  for stage in spec.stages:
    if stage.kind != 'realm':
      continue
    bindings = stage.args['bindings']
    steps, every = bindings['train.num_steps'], bindings[
        'train.checkpoint_every']
    saved = {s for s in range(1, steps + 1) if s % every == 0}
    if stage.args['builder'] is None:
      assert saved <= {steps}, stage.name
      continue
    snapshots = bindings.get('train.retriever_every')
    saved |= {s for s in range(1, steps + 1)
              if snapshots and s % snapshots == 0}
    interval = stage.args['builder']['run_refresh.refresh_interval_steps']
    assert set(range(interval, steps + 1, interval)) <= saved, stage.name
    along = bindings.get('train.keep_every')
    if along:
      assert along % every == 0, stage.name


@pytest.mark.integration
@pytest.mark.slow
def test_realm_learns_to_retrieve_and_fill_in_a_small_world(tmp_path):
  """The `world_small` preset through the real trainer, with the index
  builder as a separate process: the retriever, taught by the masked-LM
  loss alone, finds the held-out people's documents, and the filled facts
  follow. Every score below is of the same 120 held-out queries, scored
  the same way: REALM after its 60 steps, its start (the same run for no
  step: the warm starts and the ICT index) and its control (the same run,
  same seed, with the towers frozen).

  Unbroken, one run read recall@1 59.2% -> 98.3% (the frozen control
  59.2%) and accuracy 47.5% -> 77.5% (control 47.5%). Each fault of the
  mechanism fails it (each run once on 2026-11-26, 2 AMD EPYC cores):
  - the retriever's gradient cut (`stop_gradient` on the relevance scores
    in `MarginalMaskedLm`): recall@1 stays at its start's, 59.2%;
  - the candidates shuffled against their queries in training (each
    query's rolled to the next one's in `MaskedLmInputs`): recall@1
    falls to 4.2%;
  - the trainer never taking a new index (`IndexClient.maybe_refresh`
    keeping its first): recall@1 85.8%, below start + 30 points (and its
    index 30 steps stale on average).
  """
  # One CPU device, as a user's run has (not the 8 the tests fake).
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  subprocess.run([sys.executable, '-m', 'realm_jax.main', 'demo',
                  '--preset=world_small', f'--work_dir={tmp_path}'],
                 cwd=REPO, env=env, check=True, capture_output=True)
  results = json.loads((tmp_path / 'results.json').read_text())
  # Without --record the run leaves the record alone.
  assert not os.path.exists(os.path.join(REPO, 'docs', 'results',
                                         'world_small.json'))
  held_out = results['held_out']
  realm, start, frozen = (held_out[n] for n in ('realm', 'start', 'frozen'))
  assert realm['queries'] == start['queries'] == frozen['queries'] == 120
  assert realm['index_step'] == realm['step'] == 60
  # Frozen towers retrieve as at the start, whatever the reader learned.
  assert frozen['recall@1'] == pytest.approx(start['recall@1'], abs=0.01)
  assert realm['recall@1'] >= 0.8, (realm, start)
  assert realm['recall@1'] > start['recall@1'] + 0.3, (realm, start)
  assert (realm['masked_token_accuracy'] >
          start['masked_token_accuracy'] + 0.2), (realm, start)
  comparisons = results['comparisons']
  for metric, margin in (('recall@1', 25), ('masked_token_accuracy', 15)):
    against_control = comparisons['realm_vs_frozen'][metric]
    assert (against_control['excludes_zero'] and
            against_control['difference'] > margin), (metric, against_control)
  # Scored at each quarter of its training too, each step with the corpus
  # embedded by that step's towers, from the checkpoints kept for it.
  along = realm['along']
  assert sorted(along, key=int) == ['15', '30', '45'], along
  assert all(v['index_step'] == int(s) for s, v in along.items())
  assert along['15']['recall@1'] < realm['recall@1'], (along, realm)
  # The trainer took the builder's indexes as it went: a trainer that kept
  # its first index would read one 30 steps stale on average.
  interval = results['sizes']['refresh_interval']
  staleness = results['pretrain_realm']['mean_index_staleness']
  assert staleness < 3 * interval, results['pretrain_realm']
  # And the trainer's own evaluation saw the rise, with whichever index it
  # was reading (one refresh behind the query tower).
  curve = results['curves']['realm']
  steps = sorted(curve['recall@1'], key=int)
  assert curve['recall@1'][steps[-1]] > curve['recall@1'][steps[0]] + 0.15
  comparison = comparisons['realm_vs_baseline']['masked_token_accuracy']
  assert comparison['excludes_zero'] and comparison['difference'] > 20, (
      comparison, held_out['baseline'])
