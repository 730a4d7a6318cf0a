"""`realm-jax import`: Google's released REALM as a realm-jax run directory.

Reads the released weights (TF-Hub modules, ORQA checkpoints or Hugging
Face's port, see `layouts`), the 13M block embeddings and the block texts,
and writes what a finished run of ours leaves: a checkpoint of the retriever
and reader with its config.gin (a Finetune run when the files hold ORQA's
span scorer, else a Pretrain run to fine-tune from), a published index of
the released embeddings, and the corpus of the released blocks with the
fingerprint that index carries. `eval`, `ask` and `train` (with
`Finetune.pretrain_model_dir`) then take it like any run of ours.

The block embeddings stream from their file into the index a slice at a
time: 13,353,718 x 128 float32 is 6.8 GB and is never held in memory. The
run directory is written beside its place and moved there when whole.
"""

import dataclasses
import json
import logging
import pickle

import gin
import jax
import numpy as np
from etils import epath

from realm_jax import errors, run_directory
from realm_jax.data import corpus
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.index import publication
from realm_jax.models import pretrained
from realm_jax.models.realm import Realm, build_realm
from realm_jax.progress import Progress
from realm_jax.released import layouts
from realm_jax.released.tensor_files import TensorFile, open_tensor_file
from realm_jax.training import run_loader, written_run
from realm_jax.input.tasks import common

log = logging.getLogger(__name__)

MODEL_GIN = 'gin/models/realm_released.gin'
FINETUNE_GIN = 'gin/runs/finetune.gin'
PRETRAIN_GIN = 'gin/runs/pretrain.gin'
# The block cut of the released corpus (and of REALM's pre-training).
BLOCK_LENGTH = 288
# Hugging Face's RealmConfig fields -> our gin bindings.
_HF_BINDINGS = {
    'vocab_size': 'BertConfig.vocab_size',
    'hidden_size': 'BertConfig.hidden_size',
    'num_hidden_layers': 'BertConfig.num_layers',
    'num_attention_heads': 'BertConfig.num_heads',
    'intermediate_size': 'BertConfig.intermediate_size',
    'max_position_embeddings': 'BertConfig.max_position_embeddings',
    'type_vocab_size': 'BertConfig.type_vocab_size',
    'layer_norm_eps': 'BertConfig.layer_norm_eps',
    'hidden_act': 'BertConfig.hidden_act',
    'retriever_proj_size': 'build_realm.projection_size',
    'span_hidden_size': 'build_realm.span_projection_size',
    'max_span_width': 'build_realm.max_span_width',
    'reader_layer_norm_eps': 'build_realm.span_layer_norm_eps',
}


@dataclasses.dataclass(frozen=True)
class Source:
  """One released weights file and the layout it follows."""
  file: TensorFile
  layout: layouts.Layout


def hf_bindings(source_paths) -> list[str]:
  """Gin bindings of the architecture a Hugging Face `config.json` beside
  a source describes (none for TensorFlow's files: BERT-base)."""
  bindings = []
  for path in source_paths:
    config = epath.Path(path)
    config = (config if config.is_dir() else config.parent) / 'config.json'
    if not config.exists():
      continue
    hf = json.loads(config.read_text())
    if hf.get('model_type') != 'realm':
      raise errors.BadInput(f'{config}: model_type={hf.get("model_type")!r}; '
                            "expected 'realm'.")
    bindings += [f'{ours} = {hf[theirs]!r}'
                 for theirs, ours in _HF_BINDINGS.items() if theirs in hf]
    if 'reader_seq_len' in hf:
      bindings.append(f'build_realm.reader_length = {hf["reader_seq_len"]}')
    if 'reader_beam_size' in hf:
      bindings.append(f'Finetune.num_candidates = {hf["reader_beam_size"]}')
    break
  return bindings


def check_vocabulary(source_paths, vocab_path: str) -> None:
  """Refuses released weights whose vocab.txt (beside a Hugging Face file,
  in a TF-Hub module's assets/) differs from the one our tasks and corpus
  tokenize with."""
  ours = epath.Path(vocab_path).read_bytes()
  for path in source_paths:
    path = epath.Path(path)
    folder = path if path.is_dir() else path.parent
    for vocab in (folder / 'vocab.txt', folder / 'assets' / 'vocab.txt'):
      if vocab.exists() and vocab.read_bytes() != ours:
        raise errors.BadInput(
            f'{vocab} is not the vocabulary the tasks use ({vocab_path}); '
            f'set {common.VOCAB_ENV}={vocab} for the import and every '
            'command that uses the imported run.')


def open_source(path: str, model: Realm) -> Source:
  """A weights file and its layout; refuses one whose tensors do not all
  fit that layout and `model`, naming each."""
  file = open_tensor_file(path)
  infos = file.infos()
  layout, _ = layouts.match_layout(infos, model)
  expected = {name: tensors[0] for name, tensors in
              layouts.expected_names(layout, model).items()}
  pretrained.check_tensors(
      f'{file.path} does not fit {layout.description} (layout '
      f'{layout.name}) for the configured model:',
      {n: i.shape for n, i in infos.items()}, expected, layout.hf,
      layout.is_ignored, {n: i.dtype for n, i in infos.items()})
  log.info('%s: %s', file.path, layout.description)
  return Source(file, layout)


def read_params(sources: list[Source], model: Realm, fresh: dict) -> dict:
  """`fresh` parameters with every part the sources hold read over them;
  each part must come from one source, and the retriever and the reader
  from some."""
  owner = {}
  for source in sources:
    for part in source.layout.parts:
      if part in owner:
        raise errors.BadInput(f'Both {owner[part].file.path} and '
                              f'{source.file.path} hold the {part}.')
      owner[part] = source
  missing = [p for p in ('retriever', 'reader') if p not in owner]
  if missing:
    raise errors.BadInput(
        'No source holds the ' + ' or the '.join(missing) + ': give the '
        'embedder and the reader (or one file with both).')
  params = jax.tree.map(np.asarray, fresh)
  for source in sources:
    tensors = layouts.layout_tensors(source.layout, model)
    read = pretrained.assemble(tensors, source.file.read, source.layout.hf,
                               np.float32)
    params = written_run.merged(params, layouts.in_model_layout(read, model))
  return params


def block_embeddings(path: str) -> tuple[TensorFile, tuple[int, int]]:
  """The file holding `block_emb` and its [num_blocks, dim] shape."""
  file = open_tensor_file(path)
  info = file.infos().get(layouts.BLOCK_EMB)
  if info is None:
    raise errors.BadInput(f'{file.path} holds no {layouts.BLOCK_EMB!r} tensor '
                          '(the released block embeddings).')
  if len(info.shape) != 2 or not np.issubdtype(info.dtype, np.floating):
    raise errors.BadInput(f'{file.path}: {layouts.BLOCK_EMB} is {info.dtype} '
                          f'{info.shape}; expected float [num_blocks, dim].')
  return file, info.shape


class _BlockRecords(pickle.Unpickler):
  """Unpickles a numpy object array of byte strings and nothing else: a
  pickle may run any code it names, so every other global is refused."""
  ALLOWED = {('numpy.core.multiarray', '_reconstruct'),
             ('numpy._core.multiarray', '_reconstruct'),
             ('numpy', 'ndarray'), ('numpy', 'dtype'),
             ('_codecs', 'encode')}

  def find_class(self, module, name):
    if (module, name) not in self.ALLOWED:
      raise pickle.UnpicklingError(
          f'block_records.npy names {module}.{name}; only an array of byte '
          'strings is read.')
    return super().find_class(module, name)


def read_texts(path: str) -> list[str]:
  """One text per block from `block_records.npy` (Hugging Face) or a
  TFRecord file of strings (`blocks.tfr`, `titles.tfr`)."""
  if path.endswith('.npy'):
    with epath.Path(path).open('rb') as f:
      version = np.lib.format.read_magic(f)
      read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                     else np.lib.format.read_array_header_2_0)
      shape, _, dtype = read_header(f)
      if dtype.hasobject:
        array = _BlockRecords(f).load()
      else:
        f.seek(0)
        array = np.load(f)
    if array.ndim != 1 or array.shape != tuple(shape):
      raise errors.BadInput(f'{path}: expected a 1-D array of texts, got '
                            f'{array.shape}.')
    return [t.decode('utf-8') if isinstance(t, bytes) else str(t)
            for t in array]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [t.decode('utf-8') for t in
          tf.data.TFRecordDataset(path).as_numpy_iterator()]


def released_blocks(tokenizer: WordPieceTokenizer, titles: list[str],
                    bodies: list[str], start_id: int = 0):
  """`corpus.Block`s `[CLS] title [SEP] body [SEP]` cut to 288 wordpieces,
  as the released embeddings were computed; each body one sentence."""
  title_ids = tokenizer.tokenize(titles).to_list()
  body_ids = tokenizer.tokenize(bodies).to_list()
  for i, (title, body, t_ids, b_ids) in enumerate(
      zip(titles, bodies, title_ids, body_ids)):
    t_ids = t_ids[:corpus.MAX_TITLE_LENGTH]
    b_ids = b_ids[:BLOCK_LENGTH - len(t_ids) - 3]
    yield corpus.Block(
        start_id + i, title, body,
        [tokenizer.cls_id, *t_ids, tokenizer.sep_id, *b_ids,
         tokenizer.sep_id], len(t_ids), [0], [len(body.encode('utf-8'))])


def write_corpus(output_dir: str, tokenizer: WordPieceTokenizer,
                 blocks_path: str, titles_path: str | None,
                 batch: int = 4096) -> dict:
  """The released blocks as a corpus of ours (titles empty without a
  titles file: Hugging Face ships the bodies alone)."""
  bodies = read_texts(blocks_path)
  titles = read_texts(titles_path) if titles_path else [''] * len(bodies)
  if len(titles) != len(bodies):
    raise errors.BadInput(f'{titles_path} holds {len(titles):,} titles for '
                          f'{len(bodies):,} blocks in {blocks_path}.')
  writer = corpus.CorpusWriter(output_dir, tokenizer.vocab_path)
  progress = Progress('blocks', len(bodies), unit='blocks')
  for start in range(0, len(bodies), batch):
    stop = min(start + batch, len(bodies))
    writer.write(released_blocks(tokenizer, titles[start:stop],
                                 bodies[start:stop], start))
    progress.update(stop - start)
  return writer.finish(BLOCK_LENGTH, max_title_length=corpus.MAX_TITLE_LENGTH,
                       num_articles=len(bodies),
                       sources=[blocks_path] + ([titles_path] if titles_path
                                                else []))


def import_released(model_dir: str, sources: list[str], blocks: str,
                    block_emb: str | None = None, titles: str | None = None,
                    corpus_name: str = 'enwiki_20181220',
                    benchmark: str = 'nq_open', gin_files=(),
                    gin_bindings=()) -> dict:
  """Writes the run directory, index and corpus; returns a summary.

  Args:
    model_dir: the run directory to write (must not exist).
    sources: the released weights: one file with both the retriever and the
      reader (an ORQA checkpoint, Hugging Face's RealmForOpenQA), or the
      embedder and the encoder (cc_news_pretrained's two TF-Hub modules).
    blocks: the block texts: `blocks.tfr` or `block_records.npy`.
    block_emb: the file holding `block_emb` (default: the source that does).
    titles: `titles.tfr`, one title per block.
    corpus_name: the corpus directory written under $REALM_CORPUS_DIR.
    benchmark: the Open-QA task of an imported fine-tuned model.
    gin_files, gin_bindings: layered over the released architecture.
  """
  model_dir = run_directory.absolute(model_dir)
  if epath.Path(model_dir).exists():
    raise errors.BadConfig(f'{model_dir} exists; import writes a new run.')
  hf = hf_bindings(sources)
  run_loader.configure([MODEL_GIN, PRETRAIN_GIN], hf + list(gin_bindings))
  model = build_realm()
  opened = [open_source(path, model) for path in sources]
  answers = any('span_head' in s.layout.parts for s in opened)
  files = [MODEL_GIN, FINETUNE_GIN if answers else PRETRAIN_GIN,
           *gin_files]
  kind = 'Finetune' if answers else 'Pretrain'
  run_loader.configure(files, [
      *hf, f'{kind}.corpus_name = {corpus_name!r}',
      # The released models were scored by ORQA's rule.
      *([f'Finetune.benchmark = {benchmark!r}',
         "Finetune.answer_rule = 'best_span'"] if answers else []),
      'train.num_steps = 0', *gin_bindings])
  configured = run_loader.configured_run()
  model = configured.run.objective.model
  if block_emb is None:
    holders = [s.file.path for s in opened
               if layouts.BLOCK_EMB in s.file.infos()]
    if not holders:
      raise errors.BadInput('No source holds block_emb: give --block_emb '
                            '(embedder/encoded/encoded.ckpt).')
    block_emb = holders[0]
  emb_file, emb_shape = block_embeddings(block_emb)
  if emb_shape[1] != model.projection_size:
    raise errors.BadInput(f'{emb_file.path}: block_emb is {emb_shape[1]}-wide; '
                          f'the retriever projects to {model.projection_size}.')

  tokenizer = common.vocabulary().tokenizer
  check_vocabulary(sources, tokenizer.vocab_path)
  corpus_dir = corpus.corpus_dir(corpus_name)
  corpus_metadata = write_corpus(corpus_dir, tokenizer, blocks, titles)
  if corpus_metadata['num_blocks'] != emb_shape[0]:
    raise errors.BadInput(f'{blocks} holds {corpus_metadata["num_blocks"]:,} '
                          f'blocks; {emb_file.path} embeds {emb_shape[0]:,}.')

  params = read_params(opened, model, written_run.fresh_params(model))
  staging = model_dir.rstrip('/') + '.incomplete'
  if epath.Path(staging).exists():
    epath.Path(staging).rmtree()
  written_run.save_params(staging, 0, params)
  progress = Progress('block embeddings', emb_shape[0], unit='rows')

  def rows(start, stop):
    progress.update(stop - start)
    return emb_file.read_rows(layouts.BLOCK_EMB, start, stop)

  embeddings = publication.Rows(emb_shape, np.dtype(np.float32), rows)
  index = publication.index_manager(run_directory.index_dir(staging))
  publication.publish(index, 0, embeddings, publication.index_metadata(
      corpus_metadata, embeddings, 0, 'exact', BLOCK_LENGTH))
  run_directory.config_path(staging).write_text(gin.config_str())
  epath.Path(staging).rename(model_dir)
  summary = {'model_dir': model_dir, 'kind': kind, 'corpus_dir': corpus_dir,
             'num_blocks': emb_shape[0],
             'sources': {s.file.path: s.layout.name for s in opened}}
  log.info('imported %s', summary)
  return summary
