"""The embedded defaults are found in site-packages without importing them."""

import os
import subprocess
import sys

import pytest

from realm_jax import default_files


@pytest.mark.unit
def test_locators_return_the_shipped_files():
  for name in ('model.safetensors', 'config.json', 'vocab.txt'):
    assert os.path.isfile(os.path.join(default_files.minilm_dir(), name))
  assert os.path.getsize(default_files.minilm_vocab()) > 200_000
  assert default_files.wiki_leads_json().endswith('summaries_en-us.json')
  assert os.path.isfile(os.path.join(default_files.ner_model_dir(), 'meta.json'))


@pytest.mark.integration
def test_locating_imports_none_of_the_packages():
  code = ('import sys; from realm_jax import default_files; '
          'default_files.minilm_dir(); default_files.wiki_leads_json(); '
          'default_files.ner_model_dir(); '
          'heavy = {"spacy", "tensorflow", "jax", default_files.MINILM_PACKAGE, '
          'default_files.WIKI_PACKAGE, default_files.NER_PACKAGE} & set(sys.modules); '
          'print(sorted(heavy))')
  out = subprocess.run([sys.executable, '-c', code], check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == '[]'


@pytest.mark.unit
def test_missing_package_says_how_to_install():
  with pytest.raises(FileNotFoundError, match='pip install no_such_package'):
    default_files.package_dir('no_such_package')
