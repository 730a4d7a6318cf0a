"""Where a fresh run's parameters start: pretrained BERT, or earlier runs.

Plain functions of a parameter tree ({'retriever': ..., 'reader': ...}; ICT
has no reader). Each warm start from another run also names that run's
(model_dir, step): the index it published of that step was embedded by the
very parameters the new run starts from, so the new run can take it as its
first index instead of embedding the corpus again.
"""

import logging
from typing import NamedTuple

from realm_jax import default_files, run_directory
from realm_jax.models import pretrained

log = logging.getLogger(__name__)


class WarmStart(NamedTuple):
  params: dict
  # (model_dir, step) of the run the retriever came from; None: fresh towers.
  index: tuple[str, int] | None = None


def _with_bert(tree, bert):
  """Replaces every 'bert' sub-tree (each tower, the reader) by `bert`."""
  if not isinstance(tree, dict):
    return tree
  return {k: (bert if k == 'bert' else _with_bert(v, bert))
          for k, v in tree.items()}


def bert(params, bert_dir: str | None, retriever_config,
         reader_config=None) -> dict:
  """Every BERT of `params` (the towers at `retriever_config`'s size, the
  reader at `reader_config`'s) from pretrained weights; bert_dir '' keeps
  the fresh ones (a model size with no pretrained weights)."""
  if bert_dir == '':
    return params
  load = lambda config: pretrained.load_bert_params(
      bert_dir or default_files.minilm_dir(), config)
  towers = load(retriever_config)
  reader = (towers if reader_config in (None, retriever_config)
            else load(reader_config))
  return {k: _with_bert(v, reader if k == 'reader' else towers)
          for k, v in params.items()}


def ict_retriever(params, ict_model_dir: str) -> WarmStart:
  """`params` with the retriever of an ICT run's last checkpoint."""
  step, ict = run_directory.restore_params(ict_model_dir)
  log.info('retriever warm-started from ICT step %d of %s', step,
           ict_model_dir)
  retriever = run_directory.in_layout_of(ict['retriever'], params['retriever'])
  return WarmStart({**params, 'retriever': retriever}, (ict_model_dir, step))


def _with_reader(model_dir: str, option: str, hint: str = ''):
  """(step, parameters) of a run's last checkpoint, which must hold a
  reader; `option` names the setting that pointed at it."""
  step, restored = run_directory.restore_params(model_dir)
  if 'reader' not in restored:
    raise ValueError(f'{option}={model_dir!r}: its step {step} has no '
                     f'reader_params (an ICT run?).{hint}')
  return step, restored


def reader(params, reader_model_dir: str) -> dict:
  """`params` with the reader (BERT and masked-LM head) of another
  pre-training run's last checkpoint."""
  step, restored = _with_reader(reader_model_dir, 'Pretrain.reader_model_dir')
  log.info('reader warm-started from step %d of %s', step, reader_model_dir)
  return {**params, 'reader': run_directory.in_layout_of(restored['reader'],
                                                         params['reader'])}


def pretrained_realm(pretrain_model_dir: str) -> WarmStart:
  """Retriever and reader of a pre-training run's last checkpoint."""
  step, restored = _with_reader(
      pretrain_model_dir, 'Finetune.pretrain_model_dir',
      ' Point it at a REALM pre-training run, or leave it unset to start '
      'from BERT weights.')
  log.info('warm-started from pre-training step %d of %s', step,
           pretrain_model_dir)
  return WarmStart(restored, (pretrain_model_dir, step))
