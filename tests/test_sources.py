"""Reading the Wikipedia leads file."""

import json

import pytest

from realm_jax import default_files
from realm_jax.data import sources

pytestmark = pytest.mark.unit


def test_reads_every_embedded_lead():
  articles = list(sources.read_wiki_leads(default_files.wiki_leads_json()))
  assert len(articles) == 10_033
  assert all(a.title and a.text for a in articles)


def test_empty_extracts_are_skipped(tmp_path):
  path = tmp_path / 'leads.json'
  path.write_text(json.dumps({'A': {'title': 'A', 'extract': 'Text.'},
                              'B': {'title': 'B', 'extract': ' '}}))
  assert list(sources.read_wiki_leads(path)) == [sources.Article('A', 'Text.')]


@pytest.mark.parametrize('content,match', [
    ('{"A": ', 'not valid JSON'),
    ('[1, 2]', 'expected a JSON object'),
    ('{"Bad": 3}', "entry 'Bad'"),
])
def test_malformed_files_name_file_and_entry(tmp_path, content, match):
  path = tmp_path / 'leads.json'
  path.write_text(content)
  with pytest.raises(ValueError, match=match) as error:
    list(sources.read_wiki_leads(path))
  assert str(path) in str(error.value)
