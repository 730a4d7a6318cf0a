"""t5x's model interface over a REALM Open-QA fine-tuning run.

t5x cannot be installed from the package index; docs/t5x.md says how the
adapter is checked without it, and what is not checked.

Retrieval runs on the host, unlike in t5x's pure-JAX models. Each method
embeds the questions on the device, then a `jax.pure_callback` searches the
run's index and gathers the candidates' wordpieces and frozen embeddings,
all in numpy: a device computation started from inside a callback can
deadlock an accelerator still running the calling program, so the search is
exact MIPS over a host copy of the index (13.35M x 128 float32 is 6.8 GB; a
batch of 32 questions is ~110 GFLOP on the host). Blocks whose scores differ
by rounding may come in another order than the device search's. The
methods so stay jittable, as t5x's partitioner requires (under a sharded
jit the callback runs once, on one device, with the whole batch), and
gradients flow through p(z|x) recomputed on the device, as in training. The
index is the one the run fine-tuned with (fine-tuning never refreshes it).

Predictions are wordpiece ids [batch, max_span_width], zero-padded, because
seqio decodes predictions with the task's 'targets' vocabulary (the same
WordPiece vocabulary, which decodes padding to nothing). The answer is the
one with the highest p(y|x) = sum_z p(z|x) p(y|z,x) over each candidate's
`top_spans` best spans (or the best span of f + S, under the run's
`Finetune.answer_rule`), as `answers.answers_of` ranks them, but keyed by
wordpieces, not by the normalized text of the block: decoded wordpieces are
lowercase and lose the block's spacing around punctuation ('1 , 000'), so
exact match can be lower than `realm-jax eval`'s for such answers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tensorflow as tf
from clu import metrics as clu_metrics
from flax import linen as nn
from flax.linen import partitioning as flax_partitioning

from realm_jax import errors
from realm_jax.evaluation.prediction import QAPredictor, read_answers
from realm_jax.input import tasks
from realm_jax.input.qa_features import QAFeatureConverter, Spec
from realm_jax.models import losses
from realm_jax.models.reader import (BEST_SPAN, MARGINAL, gold_span_mask,
                                     span_mask)

_TOKEN_KEYS = ('token_ids', 'input_mask', 'token_type_ids')


class QAModelFeatureConverter(QAFeatureConverter):
  """QA task features -> the model features `RealmQAModel` reads.

  Beside the question, the answers stay: 'targets' (the first answer's
  wordpieces, which `score_batch` scores as t5x scores a task's targets) and
  'answer_token_ids' [answers, wordpieces] (every answer: the gold spans of
  the fine-tuning loss), each answer cut to the length of 'targets'.
  """
  MODEL_FEATURES = {**QAFeatureConverter.MODEL_FEATURES,
                    'answer_token_ids': Spec(dtype=tf.int32, rank=2),
                    'targets': Spec(dtype=tf.int32)}

  def _convert_features(self, ds, task_feature_lengths):
    lengths = self.get_model_feature_lengths(task_feature_lengths)
    # seqio checks the answer count alone (a rank-2 feature's length is its
    # first dimension); the wordpieces are cut and padded here too.
    lengths['answer_token_ids'] = (lengths['answer_token_ids'],
                                   lengths['targets'])
    ds = ds.map(lambda f: {k: f[k] for k in self.MODEL_FEATURES},
                num_parallel_calls=tf.data.AUTOTUNE)
    return seqio.utils.trim_and_pad_dataset(ds, lengths)

  def get_model_feature_lengths(self, task_feature_lengths):
    return {**super().get_model_feature_lengths(task_feature_lengths),
            'answer_token_ids': task_feature_lengths['answer_token_ids'],
            'targets': task_feature_lengths['targets']}


def top_k_inner_products(queries, rows, k: int):
  """Exact MIPS in numpy: (scores [Q, k] float32, ids [Q, k] int32), best
  first, ties to the lower id as `index.exact` breaks them."""
  scores = np.asarray(queries, np.float32) @ rows.T
  cut = rows.shape[0] - k
  ids = np.empty((len(scores), k), np.int32)
  for q, row in enumerate(scores):
    candidates = np.flatnonzero(row >= np.partition(row, cut)[cut])
    ids[q] = candidates[np.argsort(-row[candidates], kind='stable')[:k]]
  return np.take_along_axis(scores, ids, axis=1), ids


def best_answers(log_p_z, span_log_probs, span_starts, span_widths,
                 reader_token_ids, max_span_width: int, sep_id: int,
                 rule: str = MARGINAL):
  """The likeliest answer of each question under `rule`, in JAX.

  Args:
    log_p_z: [B, k] log p(z|x), -inf on padding (for 'best_span' the
      joint's, as `answers.answers_of` takes it).
    span_log_probs: [B, k, N] log p(s|z,x) of each candidate's N best spans.
    span_starts / span_widths: [B, k, N] their reader positions.
    reader_token_ids: [B, k, L] reader inputs.
    max_span_width: W, the most wordpieces of a span.
    sep_id: spans holding a [SEP] (across z's title and body) are no answer.
    rule: 'marginal' or 'best_span' (`evaluation.answers`).

  Returns:
    (wordpiece ids [B, W], zero-padded; log p(y|x) [B], where p(y|x) sums
    p(z|x) p(s|z,x) over the spans s spelling y, or for 'best_span' the
    best span's log p(z, s|x); -inf and no wordpieces when a question has
    no span.)
  """
  batch, k, n = span_log_probs.shape
  length = reader_token_ids.shape[-1]
  offsets = jnp.arange(max_span_width)
  positions = jnp.minimum(span_starts[..., None] + offsets, length - 1)
  tokens = jnp.take_along_axis(
      jnp.broadcast_to(reader_token_ids[:, :, None], (batch, k, n, length)),
      positions, axis=-1)
  tokens = jnp.where(offsets <= span_widths[..., None], tokens, 0).reshape(
      batch, k * n, max_span_width)
  joint = (log_p_z[..., None] + span_log_probs).reshape(batch, k * n)
  valid = jnp.isfinite(joint) & ~jnp.any(tokens == sep_id, axis=-1)
  same = jnp.all(tokens[:, :, None] == tokens[:, None], axis=-1) & valid[
      :, None]
  spelled = jnp.broadcast_to(joint[:, None], same.shape)
  log_p_y = jnp.where(valid, losses.masked_logsumexp(spelled, same, axis=-1)
                      if rule == MARGINAL else
                      jnp.max(jnp.where(same, spelled, -jnp.inf), axis=-1),
                      -jnp.inf)
  best = jnp.argmax(log_p_y, axis=-1)  # The first on ties, as answers_of.
  best_log_p = jnp.max(log_p_y, axis=-1)
  answer = jnp.take_along_axis(tokens, best[:, None, None], axis=1)[:, 0]
  return jnp.where(jnp.isfinite(best_log_p)[:, None], answer, 0), best_log_p


def _query(token_ids) -> dict:
  """`step_inputs.token_arrays` of the questions, traceable."""
  token_ids = jnp.asarray(token_ids, jnp.int32)
  return {'token_ids': token_ids,
          'input_mask': (token_ids != 0).astype(jnp.int32),
          'token_type_ids': jnp.zeros_like(token_ids)}


def _params_axes(boxed) -> dict:
  """t5x's 'params_axes' collection: each parameter's logical axis names
  (every parameter has them, see `training.partitioning`) as `<name>_axes`
  AxisMetadata."""
  axes = {}
  for name, value in boxed.items():
    if isinstance(value, dict):
      axes[name] = _params_axes(value)
    else:
      axes[f'{name}_axes'] = flax_partitioning.AxisMetadata(names=value.names)
  return axes


class RealmQAModel:
  """A REALM Open-QA fine-tuning run behind t5x's `BaseModel` interface.

  Model features (see `QAModelFeatureConverter`): 'query_token_ids' [B, Lq]
  for every method, 'answer_token_ids' [B, A, T] for `loss_fn`, 'targets'
  [B, T] for `score_batch`.

  Attributes:
    params: the run's parameters at the restored checkpoint (t5x does not
      read realm-jax's Orbax checkpoints: pass these as its params).
    run: the Finetune run kind, rebuilt from the run's gin config.
    predictor: the `QAPredictor` it was restored with (host-side answers in
      the block's own words, for comparison).
  """
  FEATURE_CONVERTER_CLS = QAModelFeatureConverter

  def __init__(self, model_dir: str, step: int | None = None, gin_files=(),
               gin_bindings=(), top_spans: int = 8):
    tasks.register()  # Its vocabularies are the run's task's.
    self.predictor = QAPredictor(model_dir, step, gin_files, gin_bindings,
                                 top_spans=top_spans, answers_only=True)
    self.run, self.params = self.predictor.run, self.predictor.params
    self.model, self.retrieval = (self.run.objective.model,
                                  self.predictor.retrieval)
    self.num_candidates = self.run.objective.num_candidates
    self.top_spans = top_spans
    searcher = self.retrieval.client.searcher
    if self.num_candidates > searcher.num_docs:
      raise errors.BadConfig(f'Finetune.num_candidates={self.num_candidates} '
                             f'exceeds the {searcher.num_docs} indexed blocks.')
    self._embeddings = np.asarray(searcher.embeddings)[:searcher.num_docs]
    self._rows = self._embeddings.astype(np.float32, copy=False)

  @property
  def input_vocabulary(self) -> seqio.Vocabulary:
    """What t5x's `verify_matching_vocabs` compares with the task's."""
    return seqio.get_mixture_or_task(self.run.task).output_features[
        'query_token_ids'].vocabulary

  @property
  def output_vocabulary(self) -> seqio.Vocabulary:
    return seqio.get_mixture_or_task(self.run.task).output_features[
        'targets'].vocabulary

  @property
  def task_feature_lengths(self) -> dict:
    """The run's lengths, for t5x's DatasetConfig.task_feature_lengths."""
    answers, wordpieces = self.run.shapes['answer_token_ids']
    return {'query_token_ids': self.run.shapes['query_token_ids'][0],
            'answer_token_ids': answers, 'targets': wordpieces}

  def get_initial_variables(self, rng, input_shapes, input_types=None):
    """Fresh parameters and their logical axes, as t5x initializes models."""
    del input_shapes, input_types  # No parameter's shape depends on them.
    boxed = self.run.objective.init(rng)
    return {'params': nn.meta.unbox(boxed), 'params_axes': _params_axes(boxed)}

  def _host_candidates(self, query_embeddings):
    """The host half of retrieval (numpy only: see the module docstring)."""
    query_embeddings = np.asarray(query_embeddings, self._embeddings.dtype)
    scores, ids = top_k_inner_products(query_embeddings, self._rows,
                                       self.num_candidates)
    blocks = self.retrieval.blocks_of(ids)
    return ({key: np.asarray(blocks[key], np.int32) for key in _TOKEN_KEYS},
            ids, scores, self._embeddings[ids])

  def _retrieve(self, params, query) -> dict:
    """What `Finetune.prepare` retrieves, from inside a traced function."""
    embeddings = self.retrieval.retriever.apply(
        {'params': params['retriever']}, *(query[k] for k in _TOKEN_KEYS),
        method='embed_query')
    batch, k = embeddings.shape[0], self.num_candidates
    shape = lambda *dims, dtype=jnp.int32: jax.ShapeDtypeStruct(dims, dtype)
    block = shape(batch, k, self.retrieval.blocks['token_ids'].shape[1])
    blocks, ids, scores, candidate_embeddings = jax.pure_callback(
        self._host_candidates,
        ({key: block for key in _TOKEN_KEYS}, shape(batch, k),
         shape(batch, k, dtype=jnp.float32),
         shape(batch, k, self._embeddings.shape[1],
               dtype=self._embeddings.dtype)),
        # Search is not differentiable; p(z|x) is recomputed downstream.
        jax.lax.stop_gradient(embeddings))
    return {'candidates': blocks, 'candidate_mask': ids >= 0,
            'candidate_ids': ids, 'retrieval_scores': scores,
            'candidate_embeddings': candidate_embeddings}

  def loss_fn(self, params, batch, dropout_rng):
    """The Finetune run kind's loss and metrics (as clu metrics, which t5x
    merges and summarizes); dropout_rng None is deterministic. A run with
    ORQA's retriever beam is scored over the k blocks read."""
    query = _query(batch['query_token_ids'])
    answers = jnp.asarray(batch['answer_token_ids'], jnp.int32)
    inputs = {'query': query, **self._retrieve(params, query),
              'answer_token_ids': answers,
              'answer_mask': (answers != 0).astype(jnp.int32)}
    deterministic = dropout_rng is None
    # Flax wants a dropout key even when dropout is off.
    rng = jax.random.PRNGKey(0) if deterministic else dropout_rng
    loss, metrics = self.run.objective.loss(params, inputs, rng, deterministic)
    return loss, {name: clu_metrics.Average.from_model_output(value)
                  for name, value in metrics.items()}

  def eval_fn(self, params, batch):
    """t5x's held-out loss: `loss_fn` without dropout."""
    return self.loss_fn(params, batch, dropout_rng=None)

  def predict_batch(self, params, batch, rng=None):
    """The answers alone (what t5x's predict_fn hands seqio to decode)."""
    return self.predict_batch_with_aux(params, batch, rng=rng)[0]

  def predict_batch_with_aux(self, params, batch, rng=None):
    """(answer wordpieces [B, W], aux): aux 'scores' log p(y|x) of each
    answer (t5x's name for a prediction's log-likelihood), 'block_ids' and
    'retrieval_scores' [B, k] of the retrieved blocks, best first."""
    del rng  # Answers are read off the spans, not sampled.
    query = _query(batch['query_token_ids'])
    retrieved = self._retrieve(params, query)
    read = read_answers(self.model, params, {'query': query, **retrieved},
                        self.top_spans)
    rule = self.predictor.answer_rule
    answers, log_p_y = best_answers(
        read['log_p_z_joint' if rule == BEST_SPAN else 'log_p_z'],
        read['span_log_p'], read['starts'], read['widths'],
        read['reader_ids'], self.model.max_span_width,
        self.predictor.tokenizer.sep_id, rule)
    return answers, {'scores': log_p_y,
                     'block_ids': retrieved['candidate_ids'],
                     'retrieval_scores': retrieved['retrieval_scores']}

  def score_batch(self, params, batch, return_intermediates=False):
    """log p(y|x) of each example's 'targets' [B]: log sum_z p(z|x) p(y|z,x),
    p(y|z,x) the sum of p(s|z,x) over the spans s of z spelling y (-inf when
    no candidate spells it). With return_intermediates also 'block_ids',
    'log_p_z' and 'log_p_y_given_z' [B, k]."""
    query = _query(batch['query_token_ids'])
    retrieved = self._retrieve(params, query)
    scores, spans, reader_inputs = self.model.apply(
        {'params': params}, query, retrieved['candidates'],
        retrieved['candidate_embeddings'], method='read_spans')
    width = self.model.max_span_width
    spans = spans.astype(jnp.float32)
    valid = span_mask(reader_inputs['block_mask'], width) & retrieved[
        'candidate_mask'][:, :, None, None]
    log_p_span = spans - losses.masked_logsumexp(spans, valid, axis=(2, 3))[
        ..., None, None]
    targets = jnp.asarray(batch['targets'], jnp.int32)[:, None]
    gold = valid & gold_span_mask(reader_inputs['token_ids'],
                                  reader_inputs['block_mask'], targets,
                                  targets != 0, width)
    log_p_y_given_z = losses.masked_logsumexp(log_p_span, gold, axis=(2, 3))
    log_p_z = losses.candidate_log_probs(scores, retrieved['candidate_mask'])
    log_p_y = jax.nn.logsumexp(log_p_z + log_p_y_given_z, axis=-1)
    if not return_intermediates:
      return log_p_y
    return log_p_y, {'block_ids': retrieved['candidate_ids'],
                     'log_p_z': log_p_z, 'log_p_y_given_z': log_p_y_given_z}
