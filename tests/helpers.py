"""What several test modules share: the tiny model's flags and runs, the QA
data and corpora they build, and stand-ins for the trainer and the index
builder (which the soak and kill tests also run as processes of their own,
so these live outside any test module)."""

import json
import os
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from realm_jax import checksums, default_files, main, run_directory
from realm_jax.data import corpus, open_qa, salient_spans
from realm_jax.index import publication
from realm_jax.index.client import IndexClient
from realm_jax.models.bert import BertConfig
from realm_jax.models.retriever import Retriever, init_retriever_params
from realm_jax.training import checkpoints
from realm_jax.training.train_state import TrainState

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get(open_qa.DATA_DIR_ENV) or os.path.join(
    os.path.dirname(__file__), '..', '..', 'shared', 'data')
needs_data = pytest.mark.skipif(
    not os.path.isdir(os.path.join(DATA_DIR, 'nq_open')),
    reason=f'no Open-QA data at {DATA_DIR} (set {open_qa.DATA_DIR_ENV})')

# A 2-layer, 32-wide BERT over the real vocab, no pretrained weights.
TINY = ['--gin_file=gin/models/tiny.gin',
        '--gin.BertConfig.hidden_size=32', '--gin.BertConfig.num_heads=4',
        '--gin.BertConfig.intermediate_size=64',
        '--gin.build_realm.projection_size=16',
        '--gin.build_realm.reader_length=64', '--gin.train.batch_size=8',
        '--gin.bert_adamw.warmup_steps=1']
RETRIEVAL = ['--gin.Pretrain.num_candidates=4', '--gin.Pretrain.max_masked=8',
             '--gin.Pretrain.query_length=32', "--gin.Pretrain.bert_dir=''"]

# Every body starts with "Zebra" and holds "stripes"; none says "giraffe".
ARTICLES = [{'title': f'Animal {i}',
             'text': f'Zebra herd number {i} has black and white stripes. '
                     f'It lives in park {i}.'} for i in range(11)] + [
    {'title': 'Crossings',
     'text': 'Zebra crossings of São Paulo, U.S.A.  are 1,000 km long; '
             'their stripes are white.'}]
NQ_TEST = [('what animal has black and white stripes?', ['Zebra']),
           ('which animal lives in park 3?', ['zebra.']),
           ('what is the tallest animal?', ['giraffe']),
           ('what do zebras have?', ['stripes'])]
TREC_TEST = [('what animal is striped?', 'zeb.a'),
             ('name a tall animal', 'giraffe|okapi')]

DIM = 128  # tiny.gin's projection.


def run_cli(argv, capsys) -> tuple[int, str]:
  """(exit code, everything printed) of a `realm-jax` command run here."""
  gin.clear_config()
  try:
    code = main.main(argv)
  except SystemExit as exit_:  # argparse's own usage errors.
    code = exit_.code
  printed = capsys.readouterr()
  return code, printed.out + printed.err


def train_tiny(model_dir, run_file, *flags):
  return main.main(['train', f'--model_dir={model_dir}',
                    f'--gin_file=gin/runs/{run_file}.gin', *TINY, *flags])


def bind_tiny(*extra):
  bindings = [f[len('--gin.'):].replace('=', ' = ', 1) for f in TINY
              if f.startswith('--gin.')] + list(extra)
  gin.add_config_file_search_path(REPO)
  gin.parse_config_files_and_bindings(['gin/models/tiny.gin'], bindings)


def finetuned(tmp_path, *flags):
  model_dir = str(tmp_path / 'finetune')
  train_tiny(model_dir, 'finetune', "--gin.Finetune.bert_dir=''",
             '--gin.Finetune.query_length=16', '--gin.train.num_steps=2',
             *flags)
  return model_dir


def zebra_data(root, tokenizer) -> dict:
  """ARTICLES as the corpus `wiki_leads` under root/corpora, and a QA data
  directory of NQ_TEST and TREC_TEST; returns the environment that points
  the command line at both."""
  source = root / 'articles.jsonl'
  source.write_text(''.join(json.dumps(a) + '\n' for a in ARTICLES))
  corpus.build_corpus(str(root / 'corpora' / 'wiki_leads'), tokenizer,
                      jsonl_paths=[str(source)])
  data = root / 'data'
  (data / 'nq_open').mkdir(parents=True)
  (data / 'nq_open' / 'topics.nq.dev.txt').write_text(''.join(
      f'{q}\t{a!r}\n' for q, a in NQ_TEST))
  (data / 'nq_open' / 'NQ-open.dev.jsonl').write_text(''.join(
      json.dumps({'question': q, 'answer': a}) + '\n' for q, a in NQ_TEST))
  (data / 'curated_trec').mkdir()
  for split in ('train', 'test'):
    (data / 'curated_trec' / f'large2180-{split}.tsv').write_text(''.join(
        f'{i}\tfactoid\t{q}\t{a}\n' for i, (q, a) in enumerate(TREC_TEST)))
  return {'REALM_CORPUS_DIR': str(root / 'corpora'),
          'REALM_DATA_DIR': str(data)}


def build_leads_corpus(root, tokenizer, num_leads: int,
                       validation_per_mille: int) -> str:
  """The first `num_leads` Wikipedia leads, built and annotated as
  `wiki_leads` under `root`; returns root (what REALM_CORPUS_DIR points at)."""
  with open(default_files.wiki_leads_json(), encoding='utf-8') as f:
    leads = dict(list(json.load(f).items())[:num_leads])
  source = root / 'leads.json'
  source.write_text(json.dumps(leads), encoding='utf-8')
  directory = str(root / 'wiki_leads')
  corpus.build_corpus(directory, tokenizer, wiki_leads_json=str(source),
                      blocks_per_shard=25 if num_leads < 100 else 100_000)
  salient_spans.annotate_corpus(directory, tokenizer, num_processes=1,
                                validation_per_mille=validation_per_mille)
  return str(root)


def flip_a_bit(path, seed: int = 0, byte: int | None = None) -> int:
  """Flips one bit of the file at `path` (of its `byte` if given), as a bad
  disk or memory would; returns its position (byte * 8 + bit)."""
  size = os.path.getsize(path)
  position = np.random.default_rng(seed).integers(size * 8)
  if byte is not None:
    position = byte * 8 + position % 8
  with open(path, 'r+b') as f:
    f.seek(position // 8)
    byte = f.read(1)[0]
    f.seek(position // 8)
    f.write(bytes([byte ^ 1 << position % 8]))
  return int(position)


def largest_file(directory) -> str:
  """The largest file under `directory` but its checksums: an item's array
  data."""
  return max((os.path.join(root, name) for root, _, names in
              os.walk(directory) for name in names
              if name != checksums.MANIFEST), key=os.path.getsize)


def tiny_retriever():
  """gin/models/tiny.gin's towers, as the trainer stand-ins build them."""
  return Retriever(BertConfig(hidden_size=128, num_layers=2, num_heads=2,
                              intermediate_size=512))


class TrainerStandIn:
  """Stands in for the trainer: saves retriever params, reads the index."""

  def __init__(self, model_dir, corpus_dir):
    self.model_dir = model_dir
    self.checkpoints = ocp.CheckpointManager(
        run_directory.checkpoints_dir(model_dir))
    self.params = init_retriever_params(tiny_retriever(), jax.random.key(0))
    self.saved = {}
    self.step = 0  # The trainer's step counter: refreshes look as it grows.
    self.client = IndexClient(model_dir, corpus.load_metadata(corpus_dir),
                              dim=DIM)

  def save(self, step):
    self.params = jax.tree.map(lambda x: x * 1.01, self.params)
    self.checkpoints.save(step, args=ocp.args.Composite(**{
        run_directory.RETRIEVER_ITEM: run_directory.StandardSave(self.params)}))
    self.checkpoints.wait_until_finished()
    self.saved[step] = self.params

  def wait_for_index(self, index_step, builder, timeout=180):
    deadline = time.time() + timeout
    while self.client.index_step != index_step:
      assert time.time() < deadline, builder.stdout.read()
      assert builder.poll() is None, builder.stdout.read()
      self.step += 1
      self.client.maybe_refresh()
      time.sleep(0.1)


def trainer_writer(model_dir, keep=2):
  """The trainer's own checkpoint writer, and a save of step s whose towers'
  parameters are all s."""
  params = init_retriever_params(tiny_retriever(), jax.random.key(0))
  writer = checkpoints.Checkpoints(model_dir, save_every=1, keep=keep)

  def save(step):
    state = TrainState(
        step=jnp.asarray(step), opt_state={}, rng=jax.random.PRNGKey(0),
        params={'retriever': jax.tree.map(
            lambda x: jnp.full_like(x, step), params)})
    writer.save(state, step, {'batches': step}, force=True)
    writer.wait()

  return writer, save


class BuilderStandIn:
  """Publishes indexes as the index builder does, keeping `keep`; the
  embeddings of step s are all s, so a mixed read would show."""

  def __init__(self, model_dir, corpus_dir, keep=2):
    self.manager = publication.index_manager(
        run_directory.index_dir(model_dir), max_to_keep=keep)
    self.meta = corpus.load_metadata(corpus_dir)
    self.step = -1

  def publish(self):
    self.step += 1
    embeddings = np.full((self.meta['num_blocks'], DIM), self.step, np.float32)
    publication.publish(self.manager, self.step, embeddings,
                        publication.index_metadata(self.meta, embeddings,
                                                   self.step, 'exact'))


def unchanged(directory: str, what: str):
  """Yields `directory`, shared by a session's or a module's tests; at
  their end, fails naming it if a test added or removed a file there: what
  one test leaves in it would decide, by the order the tests ran in, what
  another reads."""
  files = lambda: {os.path.relpath(os.path.join(root, name), directory)
                   for root, _, names in os.walk(directory) for name in names}
  before = files()
  yield directory
  changed = sorted(before ^ files())
  assert not changed, (
      f'A test changed the shared {what} {directory} ({len(changed)} files '
      f'added or removed: {changed[:5]}...); give it a copy.')
