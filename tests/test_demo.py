"""`make demo`'s plumbing: finished stages are skipped, and the results table
states what did not run."""

from realm_jax import demo


def test_a_finished_stage_is_skipped_on_a_rerun(tmp_path):
  calls = []
  stages = demo.Stages(str(tmp_path))
  first = stages.run('ict', lambda x: calls.append(x) or {'steps': x}, 3)
  again = stages.run('ict', lambda x: calls.append(x), 4)
  assert calls == [3] and first == again and again['steps'] == 3
  assert again['seconds'] >= 0


def test_results_table_without_qa_data_says_so():
  results = {'masked_lm': {name: {'masked_token_accuracy': value, 'loss': 7.0}
                           for name, value in (('realm', 0.25),
                                               ('null_document_only', 0.125),
                                               ('stale_index', 0.2))},
             'timings': {'corpus': 90.0, 'pretrain': 200.0}}
  text = demo.markdown(results)
  assert '| 25.0 |' in text and '| 12.5 |' in text and '| 20.0 |' in text
  assert text.count('not run (no QA data)') == 4 + 3
  assert '| total | 290 |' in text and '13,353,718' in text
