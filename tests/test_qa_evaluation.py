"""`realm-jax eval` and `ask`: known EM and recall from a fixed model and
corpus, and answers in the block's own words."""

import io
import json
import types

import gin
import jax
import numpy as np
import pytest

from realm_jax import main
from realm_jax.data import answer_matching, corpus
from realm_jax.evaluation import qa_evaluation
from realm_jax.evaluation.answers import BlockTexts, answers_of
from realm_jax.training import run_loader
from realm_jax.input.tasks import open_qa as open_qa_tasks
from tests.helpers import NQ_TEST, TREC_TEST, finetuned



def _flat_reader(predictor):
  """Every span scores 0: p(s|z,x) is uniform over the spans of z, and the
  best span (lowest index on ties) is z's first wordpiece, 'Zebra'."""
  score = predictor.params['reader']['span_head']['score']
  predictor.params['reader']['span_head']['score'] = jax.tree.map(
      np.zeros_like, score)


@pytest.mark.integration
def test_eval_gives_the_known_exact_match_and_recall(zebra):
  model_dir = finetuned(zebra)
  predictor = qa_evaluation.QAPredictor(model_dir, top_spans=1)
  _flat_reader(predictor)
  out = str(zebra / 'eval')
  nq = qa_evaluation.evaluate(predictor, 'nq_open', out, batch_size=3)
  # By DPR's rule 'zebra.' is in no block: its '.' is a token, and no
  # block has 'Zebra' before a full stop. Exact match still normalizes it.
  assert nq['questions'] == 4 and nq['answer_in_corpus'] == 2
  assert nq['exact_match'] == 50.0  # 'Zebra' and 'zebra.' match.
  assert nq['exact_match_answer_in_corpus'] == 50.0
  # Every block is retrieved (12 < 100), so top-k stops at 5; 'Zebra' and
  # 'stripes' are in every block.
  assert nq['retrieved'] == 12 and 'top-20' not in nq
  assert nq['top-1'] == nq['top-5'] == 50.0
  assert nq['top-5_answer_in_corpus'] == 100.0
  assert nq['unaligned_spans'] == 0
  rows = [json.loads(line) for line in open(f'{out}/nq_open_predictions.jsonl')]
  assert [r['prediction'] for r in rows] == ['Zebra'] * 4  # Its casing.
  assert [r['correct'] for r in rows] == [True, True, False, False]
  assert all(len(r['retrieved']) == 12 and r['retrieved'][0]['title']
             for r in rows)
  assert [r['answer_rank'] for r in rows] == [1, None, None, 1]
  assert rows[1]['answer_in_top'] == {'1': False, '5': False}
  assert [c['has_answer'] for c in rows[0]['retrieved']] == [True] * 12
  # p(y|x) = sum_z p(z|x) / (number of spans in z): one span each, uniform.
  assert all(0 < r['p_answer'] <= 1 for r in rows)
  trec = qa_evaluation.evaluate(predictor, 'curated_trec', out)
  assert trec['regex_match'] == 50.0 and trec['top-5'] == 50.0
  # The same questions from files of their own score the same.
  nq_file = zebra / 'nq.jsonl'
  nq_file.write_text(''.join(json.dumps({'question': q, 'answer': a}) + '\n'
                             for q, a in NQ_TEST))
  trec_file = zebra / 'trec.txt'
  trec_file.write_text(''.join(f'{q}\t{[a]!r}\n' for q, a in TREC_TEST))
  for path, regex, benchmark, batch_size in ((nq_file, False, nq, 3),
                                             (trec_file, True, trec, 32)):
    task = open_qa_tasks.register_qa_file(str(path), regex)
    scored = qa_evaluation.evaluate(predictor, task, out, batch_size)
    assert scored == {**benchmark, 'task': task}
    assert qa_evaluation.read_predictions(out, task) == (
        qa_evaluation.read_predictions(out, benchmark['task']))
    # Read by `eval --qa_file`, without seqio: the same.
    qa_file = qa_evaluation.QAFile(str(path), regex)
    assert qa_evaluation.evaluate(predictor, qa_file, f'{out}/file',
                                  batch_size) == scored
    assert qa_evaluation.read_predictions(f'{out}/file', task) == (
        qa_evaluation.read_predictions(out, task))
  # A benchmark's train split (NQ's dev topics, where levers are chosen)
  # read from the data directory: here the test questions again.
  for benchmark, found, batch_size in (('nq_open', nq, 3),
                                       ('curated_trec', trec, 32)):
    split = qa_evaluation.QASplit(benchmark, 'train')
    assert qa_evaluation.evaluate(predictor, split, f'{out}/split',
                                  batch_size) == {**found, 'task': split.task}
    assert qa_evaluation.read_predictions(f'{out}/split', split.task) == (
        qa_evaluation.read_predictions(out, benchmark))
  # The command line: its own predictor (the trained reader), the same
  # retrieval.
  main.main(['eval', f'--model_dir={model_dir}', f'--qa_file={nq_file}',
             f'--output_dir={out}/cli', '--top_k=3',
             f'--retrieval_output={out}/retrieval.json'])
  task = open_qa_tasks.register_qa_file(str(nq_file))
  with open(f'{out}/cli/{task}_metrics.json') as f:
    cli = json.load(f)
  assert (cli['questions'], cli['answer_in_corpus'], cli['top-1'],
          cli['retrieved']) == (4, 2, 50.0, 3)
  assert 'top-5' not in cli  # Only 3 retrieved.
  # The retrievals, read back as DPR's and Pyserini's scorers read them.
  with open(f'{out}/retrieval.json') as f:
    assert _dpr_top_k(json.load(f), (1, 3)) == [50.0, 50.0]
  rows = qa_evaluation.read_predictions(out, 'nq_open')
  pyserini = qa_evaluation.retrieval_file(rows, predictor.texts, 'pyserini')
  assert _pyserini_top_k(json.loads(pyserini), (1, 5, 12)) == [
      nq['top-1'], nq['top-5'], 50.0]
  _assert_trec_run_is_the_dpr_retrieval(rows, predictor.texts)
  assert 'exact_match' in cli


@pytest.mark.unit
def test_answers_in_corpus_are_searched_once_per_corpus_and_questions(
    tmp_path, caplog):
  metadata = tmp_path / corpus.METADATA
  metadata.write_text(json.dumps({'corpus_fingerprint': 'a' * 64}))
  bodies = {0: 'Zebras have stripes.', 1: 'Giraffe necks are long.'}
  questions = [(['zebras'], False), (['okapi'], False), (['^Gir'], True)]
  searched = []

  class Counting(answer_matching.CorpusAnswers):
    def anywhere(self, *args):
      searched.append(1)
      return super().anywhere(*args)

  find = lambda questions, **kw: qa_evaluation.answers_in_corpus(
      str(tmp_path), Counting(bodies), len(bodies), questions, **kw)
  assert find(questions) == [True, False, True]
  assert find(questions) == [True, False, True] and len(searched) == 1
  # Other questions, or the corpus changed: searched again.
  assert find(questions[:1]) == [True] and len(searched) == 2
  metadata.write_text(json.dumps({'corpus_fingerprint': 'b' * 64}))
  assert find(questions) == [True, False, True] and len(searched) == 3
  assert len(list(tmp_path.glob('answers_in_corpus-*.json'))) == 3
  # Past the limit: said, and not searched.
  metadata.write_text(json.dumps({'corpus_fingerprint': 'c' * 64}))
  assert find(questions, max_blocks=1) is None and len(searched) == 3
  assert 'skipped' in caplog.text and str(tmp_path) in caplog.text


def _dpr_top_k(questions, ks):
  """Top-k accuracy (%) as DPR's `calculate_matches` counts it from a
  retriever's output, each has_answer checked against the block's text."""
  first = []
  for question in questions:
    for ctx in question['ctxs']:
      assert float(ctx['score']) <= float(question['ctxs'][0]['score'])
      assert ctx['has_answer'] == answer_matching.has_answer(
          ctx['text'], question['answers'], False), ctx
    hits = [ctx['has_answer'] for ctx in question['ctxs']]
    first.append(hits.index(True) if any(hits) else None)
  return [100 * np.mean([f is not None and f < k for f in first]) for k in ks]


def _read_trec_run(text: str) -> dict[str, list[tuple[int, str, str]]]:
  """{qid: [(rank, docid, score)]} of a TREC run, as trec_eval reads one:
  six fields split on whitespace, each question's ordered by score."""
  run = {}
  for line in text.splitlines():
    qid, q0, docid, rank, score, tag = line.split()
    assert q0 == 'Q0' and tag
    run.setdefault(qid, []).append((int(rank), docid, score))
  return {qid: sorted(hits, key=lambda h: -float(h[2]))
          for qid, hits in run.items()}


def _assert_trec_run_is_the_dpr_retrieval(rows, texts):
  run = _read_trec_run(qa_evaluation.retrieval_file(rows, texts, 'trec'))
  dpr = json.loads(qa_evaluation.retrieval_file(rows, texts, 'dpr'))
  assert run == {str(n): [(rank, ctx['id'], ctx['score'])
                          for rank, ctx in enumerate(q['ctxs'], 1)]
                 for n, q in enumerate(dpr) if q['ctxs']}


@pytest.mark.unit
def test_a_trec_run_holds_the_ranks_scores_and_docids_of_the_dpr_file():
  rows = [{'question': 'q0', 'references': ['a'], 'retrieved': [
      {'block_id': 7, 'title': 'T7', 'score': 3.25, 'has_answer': True},
      {'block_id': 2, 'title': 'T2', 'score': 1.0000001, 'has_answer': False},
      {'block_id': 11, 'title': 'T11', 'score': -0.5, 'has_answer': False}]},
          {'question': 'q1', 'references': ['b'], 'retrieved': []},
          {'question': 'q2', 'references': ['c'], 'retrieved': [
              {'block_id': 2, 'title': 'T2', 'score': 2e-07,
               'has_answer': True}]}]
  texts = types.SimpleNamespace(bodies={7: 'seven', 2: 'two', 11: 'eleven'})
  text = qa_evaluation.retrieval_file(rows, texts, 'trec', tag='run_a')
  assert text.splitlines() == [
      '0 Q0 7 1 3.25 run_a', '0 Q0 2 2 1.0000001 run_a',
      '0 Q0 11 3 -0.5 run_a', '2 Q0 2 1 2e-07 run_a']
  _assert_trec_run_is_the_dpr_retrieval(rows, texts)


def _pyserini_top_k(retrieval, ks):
  """Top-k accuracy (%) as Pyserini's `evaluate_dpr_retrieval` counts it."""
  accuracy = {k: [] for k in ks}
  for qid in retrieval:
    contexts = retrieval[qid]['contexts']
    first = next((i for i, c in enumerate(contexts[:max(ks)])
                  if c['has_answer']), max(ks))
    title, body = contexts[0]['text'].split('\n', 1)
    assert title and body
    for k in ks:
      accuracy[k].append(first < k)
  return [100 * np.mean(accuracy[k]) for k in ks]


@pytest.mark.integration
def test_span_text_keeps_the_casing_accents_and_spacing(zebra, tokenizer):
  texts = BlockTexts(str(zebra / 'corpora' / 'wiki_leads'), tokenizer)
  block = next(i for i, t in texts.titles.items() if t == 'Crossings')
  body = texts.bodies[block]
  ids = tokenizer.tokenize([body]).to_list()[0]
  phrase = 'São Paulo, U.S.A.  are 1,000'
  first = len(tokenizer.tokenize([body[:body.index(phrase)]]).to_list()[0])
  last = first + len(tokenizer.tokenize([phrase]).to_list()[0]) - 1
  assert texts.span_text(block, 'body', first, last,
                         ids[first:last + 1]) == phrase


def _two_animals(zebra, tokenizer):
  """The corpus' texts, the block ids of 'Animal 0' and 'Animal 1', and
  their bodies' wordpieces [2, L] as the reader would hold them."""
  texts = BlockTexts(str(zebra / 'corpora' / 'wiki_leads'), tokenizer)
  ids = [next(i for i, t in texts.titles.items() if t == f'Animal {n}')
         for n in (0, 1)]
  pieces = [tokenizer.tokenize([texts.bodies[b]]).to_list()[0] + [0] * 8
            for b in ids]
  width = max(map(len, pieces))
  return texts, ids, np.array([p + [0] * (width - len(p)) for p in pieces])


@pytest.mark.integration
def test_answer_probability_adds_the_blocks_that_spell_it(zebra, tokenizer):
  texts, (a0, a1), pieces = _two_animals(zebra, tokenizer)
  # Candidate a0: 'Zebra' 0.5, 'number' 0.2; a1: 'Zebra' 0.4, '1' 0.1.
  answers = answers_of(
      texts, [a0, a1], np.log([0.75, 0.25]), np.log([[0.5, 0.2], [0.4, 0.1]]),
      np.array([[0, 2], [0, 3]]), np.zeros((2, 2), int), pieces,
      lambda z, position: ('body', position))
  assert [a.text for a in answers] == ['Zebra', 'number', '1']
  np.testing.assert_allclose(answers[0].probability, 0.75 * 0.5 + 0.25 * 0.4)
  assert answers[0].per_block == pytest.approx({a0: 0.5, a1: 0.4})
  np.testing.assert_allclose(answers[1].probability, 0.75 * 0.2)


@pytest.mark.integration
def test_orqas_rule_takes_the_single_best_span(zebra, tokenizer):
  texts, (a0, a1), pieces = _two_animals(zebra, tokenizer)
  # a0: 'number' 0.45, 'Zebra' 0.3; a1: 'Zebra' 0.3, '1' 0.1. Summed,
  # 'Zebra' (0.3) beats 'number' (0.225); its best span does not.
  args = (texts, [a0, a1], np.log([0.5, 0.5]),
          np.log([[0.45, 0.3], [0.3, 0.1]]), np.array([[2, 0], [0, 3]]),
          np.zeros((2, 2), int), pieces, lambda z, position: ('body', position))
  marginal = answers_of(*args)
  best_span = answers_of(*args, rule='best_span')
  assert [a.text for a in marginal] == ['Zebra', 'number', '1']
  assert [a.text for a in best_span] == ['number', 'Zebra', '1']
  np.testing.assert_allclose([a.probability for a in best_span],
                             [0.225, 0.15, 0.05])
  assert best_span[1].per_block == pytest.approx({a0: 0.3, a1: 0.3})


@pytest.mark.integration
def test_ask_prints_the_answer_and_its_blocks(zebra, capsys, monkeypatch):
  """Of a run fine-tuned on a file of questions, which `ask` rebuilds."""
  questions_file = zebra / 'train.jsonl'
  questions_file.write_text(''.join(
      json.dumps({'question': q, 'answer': a}) + '\n' for q, a in NQ_TEST))
  model_dir = finetuned(zebra, f"--gin.Finetune.qa_file='{questions_file}'")
  assert run_loader.load_run(model_dir).run.task == (
      open_qa_tasks.register_qa_file(str(questions_file)))
  gin.clear_config()
  main.main(['ask', 'what animal has stripes?', f'--model_dir={model_dir}'])
  out = capsys.readouterr().out
  assert 'A: ' in out and 'p(y|x)' in out and 'p(z|x)' in out
  assert out.count('Animal ') + out.count('Crossings') >= 3
  # Many questions, from standard input, answered by one loaded model.
  questions = ['what animal has stripes?', 'which animal lives in park 3?']
  monkeypatch.setattr('sys.stdin', io.TextIOWrapper(io.BytesIO(
      f'{questions[0]}\n\n{questions[1]}\n'.encode())))
  output = zebra / 'answers.jsonl'
  main.main(['ask', '--questions=-', f'--model_dir={model_dir}',
             f'--output={output}'])
  out = capsys.readouterr().out
  assert [line[3:] for line in out.splitlines() if line.startswith('Q: ')
          ] == questions
  assert out.count('A: ') == 2 and out.count('p(z|x)') == 2
  rows = [json.loads(line) for line in output.read_text().splitlines()]
  assert [r['question'] for r in rows] == questions
  for row in rows:
    assert row['answer'] and 0 < row['p_answer'] <= 1
    assert len(row['blocks']) == 5 and all(
        b['title'] and 0 <= b['p_z'] <= 1 and 'p_y_given_z' in b
        for b in row['blocks'])
    assert sum(b['p_z'] for b in row['blocks']) == pytest.approx(1, abs=1e-4)


@pytest.mark.unit
def test_eval_offers_the_retrieval_file_and_refuses_it_for_two_tasks(capsys):
  with pytest.raises(SystemExit):
    main.main(['eval', '--help'])
  assert '--retrieval_output' in capsys.readouterr().out
  with pytest.raises(SystemExit):
    main.main(['eval', '--model_dir=x', '--task=nq_open',
               '--retrieval_output=r.txt', '--retrieval_format=kilt'])
  assert "choose from 'dpr', 'pyserini', 'trec'" in capsys.readouterr().err
  assert main.main(['eval', '--model_dir=x', '--task=nq_open',
                    '--task=web_questions', '--retrieval_output=r.json']) == 2
  assert 'one QA task, not 2' in capsys.readouterr().err
  assert main.main(['eval', '--model_dir=x', '--task=nq_open',
                    '--top_k=0']) == 2
  assert '--top_k 0' in capsys.readouterr().err
  with pytest.raises(ValueError, match="'dpr', 'pyserini', 'trec'"):
    qa_evaluation.retrieval_file([], None, 'kilt')
