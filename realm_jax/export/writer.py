"""`realm-jax export`: a run in the formats the field's tools load.

From any run with a published index (ICT, pre-training, fine-tuning):

- `query_encoder/`, `document_encoder/`: sentence-transformers directories
  (BERT as safetensors, the run's pooling, the projection to 128 as a
  Dense module, its LayerNorm, the tokenizer files);
- `reader/` (runs with a reader): a transformers `BertForMaskedLM`
  directory, the decoder tied to the word embeddings as trained, and for a
  fine-tuning run its span scorer as `span_head.safetensors`;
- `index/`: the newest published index as a FAISS `IndexFlatIP` file
  (`index`), the block ids in Pyserini's FAISS layout (`docid`), the block
  texts as JSONL (`blocks.jsonl`: id, title, text);
- `config.gin` (the run's), `README.md` (a model card) and
  `manifest.json` (every file, its size and sha256).

sentence-transformers' LayerNorm has an epsilon of 1e-5 and ours BERT's
(1e-12). LayerNorm(s x) with epsilon e equals LayerNorm(x) with epsilon
e / s^2, so the Dense module is written scaled by s (`projection_scale`),
the power of two nearest sqrt(1e-5 / ours): exact both ways, and the
epsilon it leaves (6e-13 for 1e-12) moves no embedding by 1e-9. No custom
code to trust.

Everything is written into `<output>.incomplete` and renamed when whole.
"""

import dataclasses
import json
import math
import os

import numpy as np
from etils import epath

from realm_jax import checksums, errors, extras, run_directory
from realm_jax.data import block_store, corpus
from realm_jax.evaluation import prediction
from realm_jax.export import card, hf_tensors, tokenizer_json
from realm_jax.index import publication
from realm_jax.models.bert import BertConfig
from realm_jax.training import run_loader, step_inputs

FORMAT, VERSION = 'realm-jax export', 1
MANIFEST, CONFIG = 'manifest.json', 'config.gin'
QUERY, DOCUMENT, READER, INDEX = ('query_encoder', 'document_encoder',
                                  'reader', 'index')
SPAN_HEAD = 'span_head.safetensors'
# sentence-transformers' LayerNorm module: torch.nn.LayerNorm's default.
ST_LAYER_NORM_EPS = 1e-5
_ST = 'sentence_transformers.'
ST_MODULES = {
    'transformer': _ST + 'base.modules.transformer.Transformer',
    'pooling': _ST + 'sentence_transformer.modules.pooling.Pooling',
    'dense': _ST + 'base.modules.dense.Dense',
    'layer_norm': _ST + 'sentence_transformer.modules.layer_norm.LayerNorm',
}
ACTIVATIONS = {'identity': 'torch.nn.modules.linear.Identity',
               'tanh': 'torch.nn.modules.activation.Tanh'}


@dataclasses.dataclass(frozen=True)
class Towers:
  """The retriever's two towers as a run builds them."""
  config: BertConfig
  projection_size: int
  share_towers: bool
  pooling: str

  @classmethod
  def of(cls, run) -> 'Towers':
    """ICT's retriever, or the one inside REALM's model."""
    model = getattr(run.objective, 'model', None)
    if model is not None:
      return cls(model.retriever_config, model.projection_size,
                 model.share_towers, model.retriever_pooling)
    retriever = run.objective.retriever
    return cls(retriever.config, retriever.projection_size,
               retriever.share_towers, retriever.pooling)


def _json(path: epath.Path, value) -> None:
  path.write_text(json.dumps(value, indent=2, default=str) + '\n')


def _safetensors(path: epath.Path, arrays: dict) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file({k: np.ascontiguousarray(v, np.float32)
             for k, v in arrays.items()}, os.fspath(path))


def _tokenizer_files(directory: epath.Path, max_length: int) -> None:
  """The run's WordPiece as Hugging Face's BertTokenizer reads it:
  `tokenizer.json` (our normalization, `tokenizer_json`) and vocab.txt."""
  vocab = step_inputs.task_tokenizer().vocab_path
  (directory / 'vocab.txt').write_bytes(epath.Path(vocab).read_bytes())
  _json(directory / 'tokenizer.json', tokenizer_json.tokenizer_json(vocab))
  # The generic fast tokenizer takes tokenizer.json as it is (the class
  # BertTokenizer would build its own lower-casing normalizer).
  _json(directory / 'tokenizer_config.json', {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'model_input_names': ['input_ids', 'token_type_ids', 'attention_mask'],
      'model_max_length': max_length, 'cls_token': '[CLS]',
      'sep_token': '[SEP]', 'pad_token': '[PAD]', 'mask_token': '[MASK]',
      'unk_token': '[UNK]'})


def _dense_module(directory: epath.Path, kernel, bias, activation: str,
                  scale: float = 1.0) -> None:
  """A sentence-transformers Dense module of our [in, out] kernel."""
  directory.mkdir()
  kernel, bias = np.asarray(kernel, np.float32), np.asarray(bias, np.float32)
  _json(directory / 'config.json', {
      'in_features': kernel.shape[0], 'out_features': kernel.shape[1],
      'bias': True, 'activation_function': ACTIVATIONS[activation],
      'module_input_name': 'sentence_embedding',
      'module_output_name': 'sentence_embedding'})
  _safetensors(directory / 'model.safetensors', {
      'linear.weight': kernel.T * scale, 'linear.bias': bias * scale})


def projection_scale(config: BertConfig) -> float:
  """What the projection is multiplied by so that sentence-transformers'
  LayerNorm computes ours (the module's docstring)."""
  return 2.0 ** round(math.log2(math.sqrt(
      ST_LAYER_NORM_EPS / config.layer_norm_eps)))


def sentence_transformer(directory: epath.Path, tower: dict, towers: Towers,
                         max_length: int) -> None:
  """One tower (BERT, pooling, projection, LayerNorm) as a
  sentence-transformers directory, its inputs cut at `max_length`."""
  config = towers.config
  pooler = towers.pooling == 'pooler'
  directory.mkdir()
  _safetensors(directory / 'model.safetensors', hf_tensors.bert_to_hf(
      tower['bert'], config, add_pooler=pooler))
  _json(directory / 'config.json', hf_tensors.config_json(
      hf_tensors.unrolled(config, pooler), 'BertModel'))
  _tokenizer_files(directory, max_length)
  _json(directory / 'sentence_bert_config.json', {
      'transformer_task': 'feature-extraction',
      'modality_config': {'text': {'method': 'forward',
                                   'method_output_name': 'last_hidden_state'}},
      'module_output_name': 'token_embeddings'})
  _json(directory / 'config_sentence_transformers.json', {
      'model_type': 'SentenceTransformer', 'similarity_fn_name': 'dot',
      'prompts': {}, 'default_prompt_name': None})
  modules = [('transformer', '')]
  (directory / '1_Pooling').mkdir()
  _json(directory / '1_Pooling' / 'config.json', {
      'embedding_dimension': config.hidden_size,
      'pooling_mode': 'mean' if towers.pooling == 'mean' else 'cls',
      'include_prompt': True})
  modules.append(('pooling', '1_Pooling'))
  if pooler:  # BERT's pooler: tanh(W [CLS] + b).
    where = f'{len(modules)}_Dense'
    _dense_module(directory / where, tower['bert']['pooler']['kernel'],
                  tower['bert']['pooler']['bias'], 'tanh')
    modules.append(('dense', where))
  where = f'{len(modules)}_Dense'
  _dense_module(directory / where, tower['projection']['kernel'],
                tower['projection']['bias'], 'identity',
                projection_scale(config))
  modules.append(('dense', where))
  where = f'{len(modules)}_LayerNorm'
  (directory / where).mkdir()
  _json(directory / where / 'config.json',
        {'dimension': towers.projection_size})
  _safetensors(directory / where / 'model.safetensors', {
      'norm.weight': tower['layer_norm']['scale'],
      'norm.bias': tower['layer_norm']['bias']})
  modules.append(('layer_norm', where))
  _json(directory / 'modules.json', [
      {'idx': i, 'name': str(i), 'path': path, 'type': ST_MODULES[kind]}
      for i, (kind, path) in enumerate(modules)])


def reader(directory: epath.Path, params: dict, config: BertConfig,
           max_length: int, span_head: tuple[int, int] | None) -> None:
  """The reader's BERT and masked-LM head as a BertForMaskedLM directory;
  `span_head` ((hidden, projection) sizes): the span scorer beside it."""
  directory.mkdir()
  arrays = hf_tensors.bert_to_hf(params['bert'], config,
                                 hf_tensors.MASKED_LM_BERT)
  arrays.update(hf_tensors.to_hf(hf_tensors.masked_lm_head_tensors(config),
                                 params['mlm_head']))
  _safetensors(directory / 'model.safetensors', arrays)
  _json(directory / 'config.json',
        hf_tensors.config_json(hf_tensors.unrolled(config),
                               'BertForMaskedLM'))
  _tokenizer_files(directory, max_length)
  if span_head:
    _safetensors(directory / SPAN_HEAD, hf_tensors.to_hf(
        hf_tensors.span_head_tensors(*span_head), params['span_head']))


def index(directory: epath.Path, embeddings: np.ndarray,
          corpus_dir: str) -> None:
  """FAISS's exact inner-product index of every block, its ids in
  Pyserini's layout, and the blocks' texts."""
  faiss = extras.require('faiss', 'realm-jax export (the FAISS index)',
                         extra='export')
  directory.mkdir()
  flat = faiss.IndexFlatIP(embeddings.shape[1])
  flat.add(np.ascontiguousarray(embeddings, np.float32))
  faiss.write_index(flat, os.fspath(directory / 'index'))
  store = block_store.open_store(corpus_dir)
  ids = range(store.num_blocks)
  (directory / 'docid').write_text(''.join(f'{i}\n' for i in ids))
  with (directory / 'blocks.jsonl').open('w') as f:
    for i in ids:
      f.write(json.dumps({'id': str(i), 'title': store.title(i),
                          'text': store.body(i)}, ensure_ascii=False) + '\n')


def _walk(folder: epath.Path):
  for path in sorted(folder.iterdir()):
    if path.is_dir():
      yield from _walk(path)
    else:
      yield path


def files(root: epath.Path) -> dict:
  """Every file under `root` but the manifest: its bytes and sha256."""
  out = {}
  for path in _walk(root):
    relative = os.path.relpath(os.fspath(path), os.fspath(root))
    if relative != MANIFEST:
      out[relative] = {'bytes': path.stat().length, 'sha256': checksums.sha256(path)}
  return out


def query_length(loaded) -> int:
  """The wordpieces of a question, as `realm-jax search` cuts them."""
  if loaded.kind == 'Finetune':
    return loaded.run.shapes['query_token_ids'][0]
  return prediction.QUESTION_LENGTH


def export(model_dir: str, output: str) -> dict:
  """Writes the export of `model_dir`'s newest checkpoint and index into
  `output` (which must not exist); returns its manifest."""
  output = os.path.abspath(output)
  if epath.Path(output).exists():
    raise errors.BadConfig(f'--output {output} exists; export writes a new '
                           'directory.')
  loaded = run_loader.load_run(model_dir)
  if loaded.index_step is None:
    raise errors.NotFound(
        f'{loaded.model_dir} has no published index to export.',
        f'Embed the corpus first: realm-jax embed --model_dir={model_dir}.')
  has_reader = loaded.kind in ('Pretrain', 'Finetune')
  step, params = run_directory.restore_params(
      loaded.model_dir, None, ('retriever', 'reader') if has_reader
      else ('retriever',))
  manager = publication.index_manager(
      run_directory.index_dir(loaded.model_dir), read_only=True)
  metadata = publication.read_metadata(manager, loaded.index_step)
  embeddings = publication.read_embeddings(manager, loaded.index_step)
  if metadata is None or embeddings is None:  # A builder pruned it.
    raise errors.NotFound(
        f'Index step {loaded.index_step} of {loaded.model_dir} was pruned '
        'while it was read.', 'Export again: the newest one is read then.')
  corpus_dir = corpus.corpus_dir(loaded.run.corpus_name)
  corpus_metadata = corpus.load_metadata(corpus_dir)
  publication.check_compatible(metadata, corpus_metadata,
                               embeddings.shape[1], manager.directory,
                               loaded.run.block_length)
  towers = Towers.of(loaded.run)
  staging = epath.Path(output + '.incomplete')
  if staging.exists():
    staging.rmtree()
  staging.mkdir(parents=True)
  try:
    retriever = params['retriever']
    for name, tower, length in (
        (QUERY, 'query_embedder', query_length(loaded)),
        (DOCUMENT, 'document_embedder', metadata['block_length'])):
      sentence_transformer(staging / name, retriever.get(
          'embedder', retriever.get(tower)), towers, length)
    parts = [QUERY, DOCUMENT]
    if has_reader:
      model = loaded.run.objective.model
      reader(staging / READER, params['reader'], model.reader_config,
             model.reader_length,
             (model.reader_config.hidden_size, model.span_projection_size)
             if loaded.kind == 'Finetune' else None)
      parts.append(READER)
    index(staging / INDEX, embeddings, corpus_dir)
    parts.append(INDEX)
    (staging / CONFIG).write_text(loaded.config)
    manifest = {
        'format': FORMAT, 'version': VERSION,
        'run': {'kind': loaded.kind, 'model_dir': loaded.model_dir,
                'step': step, 'index_step': loaded.index_step,
                'towers': dataclasses.asdict(towers) | {
                    'config': dataclasses.asdict(towers.config)}},
        'corpus': {'name': loaded.run.corpus_name,
                   'fingerprint': corpus_metadata['corpus_fingerprint'],
                   'num_blocks': corpus_metadata['num_blocks'],
                   'sources': corpus_metadata.get('sources', [])},
        'index': metadata, 'parts': parts}
    (staging / 'README.md').write_text(card.model_card(
        manifest, loaded, projection_scale(towers.config)))
    manifest['files'] = files(staging)
    _json(staging / MANIFEST, manifest)
    staging.rename(output)
  except BaseException:
    staging.rmtree(missing_ok=True)
    raise
  return manifest


def check(export_dir: str) -> dict:
  """The manifest of a whole export, every file checked against it."""
  root = epath.Path(export_dir)
  path = root / MANIFEST
  if not path.exists():
    raise errors.NotFound(f'{export_dir} holds no {MANIFEST}: not a '
                          'realm-jax export.')
  try:
    manifest = json.loads(path.read_text())
  except (UnicodeDecodeError, ValueError) as error:  # Cut short, say.
    raise errors.BadInput(f'{path} is not JSON ({error}).',
                          'Copy the export again, whole.') from error
  if not isinstance(manifest, dict):
    raise errors.BadInput(f'{path} holds {_json_kind(manifest)}, not the '
                          "object of an export's manifest.")
  if manifest.get('format') != FORMAT:
    raise errors.BadInput(f'{path}: format {manifest.get("format")!r}; '
                          f'expected {FORMAT!r}.')
  _check_shape(manifest, path)
  found = files(root)
  for name, listed in manifest['files'].items():
    if name not in found:
      raise errors.NotFound(f'{root / name} is missing; the manifest '
                            'lists it.')
    if found[name]['sha256'] != listed.get('sha256'):
      raise errors.BadInput(f'{root / name} is damaged: its sha256 is not '
                            'the one the manifest lists.')
  return manifest


# The manifest's fields an import reads, with the type each must have.
_FIELDS = {'run': dict, 'corpus': dict, 'index': dict, 'parts': list,
           'files': dict}
_RUN_FIELDS = {'kind': str, 'step': int}
_CORPUS_FIELDS = {'name': str, 'fingerprint': str}


def _check_shape(manifest: dict, path) -> None:
  """Refuses, naming the field, a manifest an import could not read (edited
  by hand, or of another tool), rather than failing deep in the import."""
  for fields, where, within in ((_FIELDS, '', manifest),
                                (_RUN_FIELDS, 'run.', manifest.get('run')),
                                (_CORPUS_FIELDS, 'corpus.',
                                 manifest.get('corpus'))):
    for name, kind in fields.items():
      value = within.get(name)
      if not isinstance(value, kind) or isinstance(value, bool):
        raise errors.BadInput(
            f'{path}: field {where}{name} is '
            + ('missing' if value is None else f'{_json_kind(value)}')
            + f'; an export writes {_json_kind(kind())} there.',
            'Copy the export again, whole.')
  if not all(isinstance(v, dict) for v in manifest['files'].values()):
    raise errors.BadInput(f'{path}: field files holds an entry that is not '
                          'an object; an export writes {"sha256": ...} for '
                          'each file.', 'Copy the export again, whole.')


def _json_kind(value) -> str:
  """What JSON calls a parsed value's type."""
  return {bool: 'a boolean', int: 'a number', float: 'a number',
          str: 'a string', list: 'an array', dict: 'an object'}.get(
              type(value), 'null')
