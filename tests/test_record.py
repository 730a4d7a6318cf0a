"""Every figure the README and docs/RESULTS.md quote is made from the
record (docs/results/*.json): none stale, none typed by hand in the README."""

import json
import os

import pytest

from realm_jax import record

pytestmark = pytest.mark.unit


def _read(name: str) -> str:
  with open(os.path.join(record.REPO, name)) as f:
    return f.read()


@pytest.mark.parametrize('name', record.DOCUMENTS)
def test_every_quoted_figure_is_what_its_record_says(name):
  text = _read(name)
  assert record.SPAN.search(text), f'{name} quotes no figure of the record'
  assert record.stale(text) == [], (
      f'{name}: run `python -m realm_jax.record` to remake them')


@pytest.mark.parametrize('name', record.DOCUMENTS)
def test_no_figure_is_quoted_outside_the_record(name):
  assert record.untraced(_read(name)) == []


def _results(tmp_path, difference):
  interval = {'a': 10 + difference, 'b': 10.0, 'difference': difference,
              'low': difference - 0.5, 'high': difference + 0.5}
  (tmp_path / 'gpu.json').write_text(json.dumps({'comparisons': {
      'masked_lm': {'realm_vs_baseline': {'masked_token_accuracy':
                                          interval}}}}))
  return str(tmp_path)


def test_a_changed_record_makes_the_quoted_figure_stale(tmp_path):
  text = 'REALM gained <!-- record:gpu.accuracy --><!-- /record --> points.'
  made = record.render(text, _results(tmp_path, 0.84))
  assert made == ('REALM gained <!-- record:gpu.accuracy -->+0.84 [+0.34, '
                  '+1.34]<!-- /record --> points.')
  assert record.stale(made, str(tmp_path)) == []
  # A hand edit of the quoted text, or a new record, is caught.
  edited = made.replace('+0.84 [', '+0.94 [')
  assert record.stale(edited, str(tmp_path)) == ['gpu.accuracy']
  assert record.stale(made, _results(tmp_path, 0.5)) == ['gpu.accuracy']


def test_an_unknown_figure_is_named():
  with pytest.raises(KeyError, match="No figure named 'world.nope'"):
    record.render('<!-- record:world.nope --><!-- /record -->')


def test_figures_outside_the_record_are_found_but_not_code_or_settings():
  text = '\n'.join([
      'It took 10 min 20 s and reached 49.9% on 172 GFLOP/s.',
      'A 95% interval, the 30x stale index, batch 16, 2 layers.',
      '`--gin.bert_adamw.learning_rate=2e-3` and [a link](x/1.5.md).',
      '```python', 'p = 0.005', '```',
      'Quoted: <!-- record:gpu.accuracy -->+0.84 [+0.4, +1.3]<!-- /record -->.',
      'It is 1.7x slower, over 10,054 blocks, in 23.5',
      'minutes, meant to take at most 20 minutes.',
      '```', 'p(y|x) 0.990', '```',
      '<!-- example output: the record of seed 0 -->',
      '```', 'p(y|x) 0.990', '```'])
  assert record.untraced(text) == [
      "line 1: '10 min'", "line 1: '20 s'", "line 1: '49.9%'",
      "line 1: '172 GFLOP/s'", "line 8: '1.7x'", "line 8: '10,054'",
      "line 8: '23.5\\nminutes'", "line 11: '0.990'"]
