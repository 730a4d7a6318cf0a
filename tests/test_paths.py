"""Every path may be local or gs://: what the system reads and writes outside
Orbax goes through etils.epath, checked here on TensorFlow's in-memory
`ram://` filesystem (the same tf.io.gfile backend epath uses for gs://), and
a scan of the source for file calls that would work on local disks only."""

import ast
import os

import jax
import numpy as np
import pytest
from etils import epath

from realm_jax.data import corpus
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.models import pretrained
from realm_jax.training.curves import plot_curves, read_metrics
from realm_jax.training.metric_writer import JsonlWriter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The library, the seqio tasks among it: what reads and writes data.
PACKAGES = [os.path.join(REPO, 'realm_jax')]


def _copy(source: str, target: epath.Path) -> epath.Path:
  target.mkdir(parents=True, exist_ok=True)
  for name in os.listdir(source):
    if os.path.isfile(os.path.join(source, name)):
      (target / name).write_bytes(epath.Path(source, name).read_bytes())
  return target


@pytest.mark.unit
def test_metrics_append_across_resumes_and_plot_on_a_remote_dir(ram):
  path = str(ram / 'run' / 'train_metrics.jsonl')
  ram.joinpath('run').mkdir(parents=True)
  for steps in ((1, 2), (2, 3)):  # A resumed run rewrites step 2.
    writer = JsonlWriter(path)
    for step in steps:
      writer.write_scalars(step, {'loss': 10.0 - step})
    writer.close()
  assert read_metrics(path)['loss'] == ([1, 2, 3], [9.0, 8.0, 7.0])
  plot_curves(path, str(ram / 'run' / 'train_curves.png'))
  assert (ram / 'run' / 'train_curves.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.unit
def test_weights_and_vocab_load_from_a_remote_dir(ram, minilm_dir):
  remote = _copy(minilm_dir, ram / 'minilm')
  config = pretrained.config_from_hf(str(remote / 'config.json'))
  local = pretrained.load_bert_params(minilm_dir, config)
  loaded = pretrained.load_bert_params(str(remote), config)
  jax.tree.map(np.testing.assert_array_equal, loaded, local)
  tokenizer = WordPieceTokenizer(str(remote / 'vocab.txt'))
  assert tokenizer.vocab == WordPieceTokenizer(
      os.path.join(minilm_dir, 'vocab.txt')).vocab


@pytest.mark.integration
def test_a_corpus_reads_from_a_remote_dir(ram, small_corpus):
  local = os.path.join(small_corpus, 'wiki_leads')
  remote = str(_copy(local, ram / 'wiki_leads'))
  assert corpus.load_metadata(remote) == corpus.load_metadata(local)
  ids = lambda d: [int(b['block_id']) for b in corpus.read_blocks(d)]
  assert ids(remote) == ids(local) == list(range(60))


# Local-only file calls; the modules that read installed packages or their
# own source tree are the exceptions.
LOCAL_ONLY = {'open', 'os.makedirs', 'os.path.exists', 'os.path.isdir',
              'os.path.isfile', 'os.path.getsize', 'os.replace', 'os.listdir',
              'os.remove', 'shutil.rmtree', 'shutil.copytree'}
ALLOWED = {'default_files.py': 'the installed packages of the embedded default',
           'launch_local.py': "its jobs' logs: local files a process writes "
                              'to (a gs:// model_dir keeps them in runs/logs)',
           'preset.py': 'preset files are Python modules, imported from '
                        'the local disk'}


def _calls(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      name = ast.unparse(node.func)
      if name in LOCAL_ONLY:
        yield node.lineno, name


@pytest.mark.unit
def test_no_local_only_file_calls_in_the_library_and_tasks():
  found = []
  for package in PACKAGES:
    for root, _, files in os.walk(package):
      for name in files:
        if name.endswith('.py') and name not in ALLOWED:
          path = os.path.join(root, name)
          with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read())
          found += [f'{os.path.relpath(path, REPO)}:{line}: {call}'
                    for line, call in _calls(tree)]
  assert not found, 'use etils.epath instead:\n' + '\n'.join(found)


@pytest.mark.unit
def test_the_scan_catches_a_bare_open():
  tree = ast.parse("with open(os.path.join(model_dir, 'x')) as f:\n  pass\n"
                   "os.makedirs(d)\nepath.Path(d).open()\n")
  assert sorted(c for _, c in _calls(tree)) == ['open', 'os.makedirs']

