"""`realm-jax import --export=DIR`: an export read back into a run.

The weights come from the files other tools load (the sentence-transformers
towers, the BertForMaskedLM reader and the span scorer beside it), the
index from the FAISS file, the settings from the export's config.gin; the
corpus must be here already (by its name and fingerprint). The run is
written beside its place and renamed when whole, as `import` does for
Google's released REALM. Parts a run has but an export leaves out (a
pre-training run's untrained span scorer) start fresh, as they did.
"""

import os

import jax
import numpy as np
from etils import epath

from realm_jax import errors, extras, run_directory
from realm_jax.data import corpus
from realm_jax.export import hf_tensors, writer
from realm_jax.index import publication
from realm_jax.models.retriever import init_retriever_params
from realm_jax.training import run_loader, written_run


def _arrays(path: epath.Path) -> dict:
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
  return safetensors_numpy.load(path.read_bytes())


def tower(directory: epath.Path, towers: writer.Towers) -> dict:
  """One sentence-transformers tower as our Embedder's parameters."""
  pooler = towers.pooling == 'pooler'
  params = {'bert': hf_tensors.bert_from_hf(
      _arrays(directory / 'model.safetensors'), towers.config,
      add_pooler=pooler)}
  scale = writer.projection_scale(towers.config)
  dense = sorted(p.name for p in directory.iterdir()
                 if p.name.endswith('_Dense'))
  projection = _arrays(directory / dense[-1] / 'model.safetensors')
  params['projection'] = {'kernel': projection['linear.weight'].T / scale,
                          'bias': projection['linear.bias'] / scale}
  norm = next(p for p in directory.iterdir() if p.name.endswith('_LayerNorm'))
  norm = _arrays(norm / 'model.safetensors')
  params['layer_norm'] = {'scale': norm['norm.weight'],
                          'bias': norm['norm.bias']}
  return params


def reader(directory: epath.Path, model) -> dict:
  """The BertForMaskedLM directory (and span scorer) as our reader's."""
  arrays = _arrays(directory / 'model.safetensors')
  config = model.reader_config
  params = {'bert': hf_tensors.bert_from_hf(arrays, config,
                                            hf_tensors.MASKED_LM_BERT),
            'mlm_head': hf_tensors.from_hf(
                hf_tensors.masked_lm_head_tensors(config), arrays)}
  if (directory / writer.SPAN_HEAD).exists():
    params['span_head'] = hf_tensors.from_hf(
        hf_tensors.span_head_tensors(config.hidden_size,
                                     model.span_projection_size),
        _arrays(directory / writer.SPAN_HEAD))
  return params


def _embeddings(directory: epath.Path) -> np.ndarray:
  faiss = extras.require('faiss', 'realm-jax import --export (the FAISS '
                         'index)', extra='export')
  flat = faiss.read_index(os.fspath(directory / 'index'))
  return flat.reconstruct_n(0, flat.ntotal)


def import_export(export_dir: str, model_dir: str) -> dict:
  """Writes the run an export holds into `model_dir` (which must not
  exist); returns a summary."""
  root = epath.Path(export_dir)
  if not root.is_dir():
    raise errors.NotFound(f'No export directory {export_dir}.',
                          'Give --export the directory `realm-jax export` '
                          'wrote.')
  manifest = writer.check(export_dir)
  model_dir = run_directory.absolute(model_dir)
  if epath.Path(model_dir).exists():
    raise errors.BadConfig(f'{model_dir} exists; import writes a new run.')
  name, fingerprint = (manifest['corpus']['name'],
                       manifest['corpus']['fingerprint'])
  corpus_dir = corpus.corpus_dir(name)
  found = (corpus.load_metadata(corpus_dir)['corpus_fingerprint']
           if (epath.Path(corpus_dir) / corpus.METADATA).exists() else None)
  if found != fingerprint:
    raise errors.NotFound(
        f'The export was trained on corpus {name!r} (fingerprint '
        f'{fingerprint[:16]}); {corpus_dir} holds '
        + ('none' if found is None else f'fingerprint {found[:16]}') + '.',
        'Point $REALM_CORPUS_DIR at the directory that holds it.')
  staging = epath.Path(model_dir.rstrip('/') + '.incomplete')
  if staging.exists():
    staging.rmtree()
  staging.mkdir(parents=True)
  try:
    run_directory.config_path(os.fspath(staging)).write_text(
        (root / writer.CONFIG).read_text())
    loaded = run_loader.load_run(os.fspath(staging))
    towers = writer.Towers.of(loaded.run)
    model = getattr(loaded.run.objective, 'model', None)
    if model is not None:
      params = written_run.fresh_params(model)
    else:
      params = {'retriever': init_retriever_params(
          loaded.run.objective.retriever, jax.random.key(0))}
    query = tower(root / writer.QUERY, towers)
    retriever = ({'embedder': query} if towers.share_towers else
                 {'query_embedder': query, 'document_embedder': tower(
                     root / writer.DOCUMENT, towers)})
    read = {'retriever': retriever}
    if writer.READER in manifest['parts']:
      read['reader'] = reader(root / writer.READER, model)
    params = written_run.merged(jax.tree.map(np.asarray, params), read)
    step = manifest['run']['step']
    written_run.save_params(os.fspath(staging), step, params)
    metadata = manifest['index']
    index = publication.index_manager(
        run_directory.index_dir(os.fspath(staging)))
    publication.publish(index, metadata['step'],
                        _embeddings(root / writer.INDEX), metadata)
    staging.rename(model_dir)
  except BaseException:
    staging.rmtree(missing_ok=True)
    raise
  return {'model_dir': model_dir, 'kind': loaded.kind, 'step': step,
          'index_step': metadata['step'], 'corpus_dir': corpus_dir}
