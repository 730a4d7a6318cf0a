"""Shared fixtures: the embedded MiniLM weights and vocab, a tiny BERT, a
small corpus; the global state each test restores; the tier check; and the
order of the test modules, the longest first.

Eight CPU devices are faked before JAX starts, so sharding tests can build
multi-device meshes; unsharded code still runs on device 0.
"""

import os
import tempfile

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
# One compilation cache for the whole session, empty at its start: the
# pytest-xdist workers (started by this process, they inherit its
# environment) and every `realm-jax` process a test starts compile each
# tiny program once between them, as a user's runs do. Removed at the end.
# A test of the cache itself names its own directory (test_main).
if 'REALM_JAX_CACHE' not in os.environ:
  os.environ['REALM_JAX_CACHE'] = tempfile.mkdtemp(prefix='realm-jax-tests-xla-')
  SESSION_CACHE = os.environ['REALM_JAX_CACHE']
else:
  SESSION_CACHE = None  # A worker's, or one the caller chose: not ours.

# pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import json
import math
import shutil
import signal

import gin
import pytest
from etils import epath
from etils.epath import backend, gpath, register

from realm_jax import default_files, main
from realm_jax.data import block_store
from realm_jax.models.bert import BertConfig
from tests.helpers import (RETRIEVAL, build_leads_corpus, train_tiny,
                           unchanged, zebra_data)

TIERS = ('unit', 'integration')
# Each test module's seconds (setup, call and teardown of its tests) in a
# whole run of the suite, written by `--record-module-seconds`. The modules
# run longest first: pytest-xdist hands a worker a whole module at a time
# (`--dist loadfile --no-loadscope-reorder`, in collection order), and a
# long module started last would keep one worker busy after the other is
# done. A module not recorded yet goes first.
MODULE_SECONDS = os.path.join(os.path.dirname(__file__), 'module_seconds.json')
# The handlers of a fresh `realm-jax` process. The launcher installs its
# own, and a library loaded in this process may replace them (then Ctrl-C
# raises no KeyboardInterrupt).
FRESH_HANDLERS = {signal.SIGINT: signal.default_int_handler,
                  signal.SIGTERM: signal.SIG_DFL}


def pytest_addoption(parser):
  parser.addoption(
      '--record-module-seconds', action='store_true',
      help="write each test module's seconds in this run to "
      'tests/module_seconds.json (the order of the next runs)')


def pytest_configure(config):
  del config
  main.use_compilation_cache()  # This process's compiles too.


def pytest_unconfigure(config):
  del config
  if SESSION_CACHE:
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


# This run's seconds by module: in pytest-xdist's controller, every
# worker's reports.
_SECONDS = collections.Counter()


def _module(nodeid: str) -> str:
  return nodeid.split('::')[0]


def _recorded() -> dict[str, float]:
  if not os.path.exists(MODULE_SECONDS):
    return {}
  with open(MODULE_SECONDS, encoding='utf-8') as f:
    return json.load(f)


def pytest_runtest_logreport(report):
  _SECONDS[_module(report.nodeid)] += report.duration


def pytest_sessionfinish(session, exitstatus):
  """With --record-module-seconds, in the process that ran or scheduled
  the tests, the modules' seconds kept for the next runs' order."""
  config = session.config
  if (not config.getoption('record_module_seconds') or
      hasattr(config, 'workerinput') or exitstatus != 0):
    return
  seconds = {**_recorded(), **{module: round(total, 1)
                               for module, total in _SECONDS.items()}}
  with open(MODULE_SECONDS, 'w', encoding='utf-8') as f:
    json.dump(dict(sorted(seconds.items())), f, indent=1)
    f.write('\n')


def pytest_collection_modifyitems(items):
  """Orders the modules longest first (MODULE_SECONDS; each module's tests
  keep their order), and fails the run unless each test has exactly one
  tier marker, so that `-m unit` and `-m integration` split the suite
  between them."""
  seconds = _recorded()
  items.sort(key=lambda item: -seconds.get(_module(item.nodeid), math.inf))
  wrong = []
  for item in items:
    tiers = sorted({marker.name for marker in item.iter_markers()} &
                   set(TIERS))
    if len(tiers) != 1:
      wrong.append(f'  {item.nodeid}: {tiers or "none"}')
  if wrong:
    raise pytest.UsageError(
        f'Each test needs exactly one of the markers {TIERS} (a module-level '
        'pytestmark or its own):\n' + '\n'.join(wrong))


@pytest.fixture(autouse=True)
def _clean_gin():
  """Each test leaves no gin config behind: a parse (the CLI's) locks it,
  and its bindings would change the next test's defaults."""
  yield
  gin.clear_config()


def _install_fresh_handlers():
  for number, handler in FRESH_HANDLERS.items():
    signal.signal(number, handler)


@pytest.fixture(autouse=True)
def _fresh_signal_handlers():
  """Each test runs with, and leaves, a fresh process's signal handlers,
  installed again at the OS level whoever replaced them."""
  _install_fresh_handlers()
  yield
  _install_fresh_handlers()


@pytest.fixture(scope='session')
def minilm_dir() -> str:
  return default_files.minilm_dir()


@pytest.fixture(scope='session')
def tokenizer(minilm_dir):
  from realm_jax.data.tokenization import WordPieceTokenizer
  return WordPieceTokenizer(os.path.join(minilm_dir, 'vocab.txt'))


@pytest.fixture
def tiny_config() -> BertConfig:
  """Two small layers over a small vocab: every test of the math runs on it."""
  return BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=48, max_position_embeddings=24)


@pytest.fixture(scope='session')
def small_corpus(tmp_path_factory, tokenizer):
  """The first 60 Wikipedia leads (20% held out); unchanged by any test.
  Its block store is written now, as the first reader would: every test
  finds the corpus as it is after that read, whichever ran first."""
  root = build_leads_corpus(tmp_path_factory.mktemp('corpora'), tokenizer,
                            60, validation_per_mille=200)
  block_store.open_store(os.path.join(root, 'wiki_leads'))
  yield from unchanged(root, 'corpora')


@pytest.fixture
def small_corpus_env(small_corpus, monkeypatch):
  """REALM_CORPUS_DIR at the small corpus, where the CLI and the seqio tasks
  look for `wiki_leads`."""
  monkeypatch.setenv('REALM_CORPUS_DIR', small_corpus)
  return small_corpus


@pytest.fixture
def zebra(tmp_path, tokenizer, monkeypatch):
  """A 12-block corpus as `wiki_leads` and a QA data dir of known answers."""
  for name, value in zebra_data(tmp_path, tokenizer).items():
    monkeypatch.setenv(name, value)
  return tmp_path


@pytest.fixture(scope='session')
def trained_pretraining(tmp_path_factory, small_corpus):
  """A 2-step tiny pre-training run on the small corpus, trained once;
  tests that change it take copies (`unchanged`)."""
  model_dir = str(tmp_path_factory.mktemp('trained') / 'pretrain')
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('REALM_CORPUS_DIR', small_corpus)
    train_tiny(model_dir, 'pretrain', *RETRIEVAL, '--gin.train.num_steps=2')
  gin.clear_config()  # Set up between tests: leaves no config behind.
  yield from unchanged(model_dir, 'run')


@pytest.fixture
def ram(monkeypatch):
  """`ram://` routed like gs://, through epath's tf.io.gfile backend."""
  monkeypatch.setattr(gpath, '_URI_PREFIXES', gpath._URI_PREFIXES + ('ram://',))
  monkeypatch.setattr(gpath, '_URI_SCHEMES', gpath._URI_SCHEMES | {'ram'})
  monkeypatch.setitem(gpath._URI_MAP_ROOT, 'ram://', '/ram/')
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, 'ram', backend.tf_backend)
  monkeypatch.setitem(register._URI_PREFIXES_TO_CLS, 'ram://',
                      gpath.PosixGPath)
  root = epath.Path(f'ram://{os.getpid()}/{id(monkeypatch)}')
  yield root
  # Files first: ram:// sees the prefix of model.ckpt.* as a directory, which
  # rmtree cannot remove.
  for path in root.glob('*'):
    if not path.is_dir():
      path.unlink()
  if root.exists():
    root.rmtree()
