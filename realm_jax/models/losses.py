"""REALM's objectives as pure functions, each checked against its equation.

Notation (Guu et al. 2020): x the query, z a candidate document, y the target,
f(x, z) the relevance score, p(z|x) = softmax_z f(x, z) over the k candidates.

The retriever's training signal (`RetrieverSignal`) is REALM's marginal
likelihood or one of its successors'. The successors train the retriever
by a term of its own, computed from the reader's likelihoods under a stop
gradient (sg), and train the reader by its own likelihood, the retriever's
weights held fixed:
  emdr2 (Sachan et al. 2021): -log sum_z p(z|x) sg(p(y|z,x));
  pdist (Atlas's perplexity distillation, Izacard et al. 2022; REPLUG's
    LSR): KL(q || p(z|x)), q = softmax_z sg(log p(y|z,x)) / temperature,
    log p(y|z,x) taken per masked token (Atlas's 'ppmean').
"""

from typing import Literal

import jax
import jax.numpy as jnp

Marginalization = Literal['per_token', 'whole_span']
RetrieverSignal = Literal['marginal', 'emdr2', 'pdist']
RETRIEVER_SIGNALS = ('marginal', 'emdr2', 'pdist')


def check_signal(signal: str, temperature: float) -> str:
  """`signal` if it names a retriever signal and its temperature is > 0."""
  if signal not in RETRIEVER_SIGNALS:
    raise ValueError(f'retriever_signal.name={signal!r}; expected one of '
                     f'{", ".join(map(repr, RETRIEVER_SIGNALS))}.')
  if not temperature > 0:
    raise ValueError(f'retriever_signal.temperature={temperature}; expected '
                     '> 0.')
  return signal


def masked_logsumexp(x, mask, axis):
  """log sum exp over the masked entries; -inf, with zero gradient, if none.

  Padding the empty sets with zeros before the reduction keeps the gradient of
  a discarded -inf free of NaN.
  """
  mask = jnp.broadcast_to(mask, x.shape)
  any_valid = jnp.any(mask, axis=axis, keepdims=True)
  safe = jnp.where(mask, x, jnp.where(any_valid, -jnp.inf, 0.0))
  out = jax.nn.logsumexp(safe, axis=axis, keepdims=True)
  return jnp.squeeze(jnp.where(any_valid, out, -jnp.inf), axis=axis)


def candidate_log_probs(scores, candidate_mask):
  """log p(z|x) = log softmax_z f(x, z) (eq. 1); masked candidates get -inf.

  Masked candidates receive exactly zero probability and zero gradient.
  """
  masked = jnp.where(candidate_mask, scores.astype(jnp.float32), -jnp.inf)
  return jax.nn.log_softmax(masked, axis=-1)


def null_score_below_best(scores, candidate_mask, offset: float):
  """f(x, null) = max_z f(x, z) - offset over the valid retrieved blocks.

  Candidate 0 must be the null document. No gradient flows through the max,
  so each retrieved block learns from its own column alone, and the null
  column teaches the towers nothing. A query with no valid block keeps its
  null score.
  """
  retrieved = scores[:, 1:]
  valid = candidate_mask[:, 1:].astype(bool)
  best = jnp.max(jnp.where(valid, retrieved, -jnp.inf), axis=-1)
  null = jnp.where(jnp.any(valid, axis=-1),
                   jax.lax.stop_gradient(best) - offset, scores[:, 0])
  return jnp.concatenate([null[:, None].astype(scores.dtype), retrieved],
                         axis=1)


def marginal_log_likelihood(log_p_z, log_p_y_given_z, target_mask,
                            marginalize: Marginalization = 'per_token'):
  """log p(y|x) of each example, marginalized over the k candidates.

  per_token (the released code): sum_j log sum_z p(z|x) p(y_j|z,x).
  whole_span (the paper's eq. 2): log sum_z p(z|x) prod_j p(y_j|z,x).

  Args:
    log_p_z: [batch, k] log p(z|x), -inf on masked candidates.
    log_p_y_given_z: [batch, k, M] log p(y_j|z,x) of each masked token j.
    target_mask: [batch, M] 1 on real masked tokens, 0 on padding.
    marginalize: 'per_token' or 'whole_span'.

  Returns:
    [batch] log p(y|x).
  """
  target_mask = target_mask.astype(bool)
  token_terms = jnp.where(target_mask[:, None, :], log_p_y_given_z, 0.0)
  if marginalize == 'whole_span':
    return jax.nn.logsumexp(log_p_z + jnp.sum(token_terms, axis=-1), axis=-1)
  if marginalize == 'per_token':
    per_token = jax.nn.logsumexp(log_p_z[:, :, None] + token_terms, axis=1)
    return jnp.sum(jnp.where(target_mask, per_token, 0.0), axis=-1)
  raise ValueError(f"marginalize={marginalize!r}; expected 'per_token' or "
                   "'whole_span'.")


def marginal_token_log_probs(log_p_z, log_p_vocab, candidate_mask):
  """log p(y_j = v|x) = log sum_z p(z|x) p(y_j = v|z,x) for every vocab entry.

  Args:
    log_p_z: [batch, k]; log_p_vocab: [batch, k, M, vocab] log p(y_j|z,x);
    candidate_mask: [batch, k].

  Returns:
    [batch, M, vocab].
  """
  return masked_logsumexp(log_p_z[:, :, None, None] + log_p_vocab,
                          candidate_mask[:, :, None, None], axis=1)


def _token_log_probs(mlm_logits, mlm_targets):
  """(log p(v|z,x) [batch, k, M, vocab], log p(y_j|z,x) [batch, k, M])."""
  log_p_vocab = jax.nn.log_softmax(mlm_logits.astype(jnp.float32), axis=-1)
  return log_p_vocab, jnp.take_along_axis(
      log_p_vocab, mlm_targets[:, None, :, None], axis=-1)[..., 0]


def realm_mlm_per_example(scores, candidate_mask, mlm_logits, mlm_targets,
                          mlm_mask, marginalize: Marginalization = 'per_token'):
  """Per-example sums of REALM's masked-LM terms (what a paired bootstrap
  resamples), and the retrieval distribution p(z|x).

  Args: as `realm_mlm_loss`.

  Returns:
    dict of [batch] arrays: masked_tokens, correct_tokens (argmax of the
    marginal p(y_j|x) equals y_j), log_likelihood (log p(y|x)),
    null_log_likelihood and null_correct_tokens (the same, reading the null
    document, candidate 0, alone); and p_z [batch, k].
  """
  mlm_mask = mlm_mask.astype(bool)
  log_p_z = candidate_log_probs(scores, candidate_mask)
  log_p_vocab, log_p_y_given_z = _token_log_probs(mlm_logits, mlm_targets)
  marginal_vocab = marginal_token_log_probs(log_p_z, log_p_vocab,
                                            candidate_mask)
  correct = lambda log_p: jnp.sum(
      (jnp.argmax(log_p, axis=-1) == mlm_targets) & mlm_mask, axis=-1)
  return {
      'masked_tokens': jnp.sum(mlm_mask, axis=-1),
      'correct_tokens': correct(marginal_vocab),
      'null_correct_tokens': correct(log_p_vocab[:, 0]),
      'log_likelihood': marginal_log_likelihood(log_p_z, log_p_y_given_z,
                                                mlm_mask, marginalize),
      'null_log_likelihood': jnp.sum(
          jnp.where(mlm_mask, log_p_y_given_z[:, 0], 0.0), axis=-1),
      'p_z': jnp.exp(log_p_z),
  }


def distillation_kl(log_p_z, reader_scores, valid, temperature: float):
  """KL(q || p(z|x)) of each example, q = softmax_z sg(reader_scores) /
  temperature over the `valid` candidates; 0 for an example with none.

  Its gradient to f(x, z) is p(z|x) - q(z): unlike r(z), it stays away
  from 0 when p(z|x) is one-hot on a block the reader does not prefer.

  Args:
    log_p_z: [batch, k] log p(z|x), -inf on masked candidates.
    reader_scores: [batch, k] the reader's log p(y|z,x) (any scale).
    valid: [batch, k] bool, the candidates q spreads over.
    temperature: of q.
  """
  valid = valid.astype(bool)
  any_valid = jnp.any(valid, axis=-1, keepdims=True)
  target = jax.lax.stop_gradient(reader_scores) / temperature
  log_q = jax.nn.log_softmax(
      jnp.where(valid, target, jnp.where(any_valid, -jnp.inf, 0.0)), axis=-1)
  q = jnp.where(valid, jnp.exp(log_q), 0.0)
  terms = jnp.where(valid, q * (log_q - log_p_z), 0.0)
  return jnp.where(any_valid[:, 0], jnp.sum(terms, axis=-1), 0.0)


def _mlm_successor_terms(log_p_z, log_p_y_given_z, candidate_mask, mlm_mask,
                         marginalize, signal, temperature):
  """Per-example (reader term, retriever term) of emdr2 or pdist.

  The reader's own likelihood of y from the k blocks it read, the
  retriever's weights held fixed: -log sum_z sg(p(z|x)) p(y|z,x). Its
  gradient is REALM's reader gradient, so with a reader that reads each
  block apart (this one; the successors' read them jointly) emdr2's two
  terms have exactly the marginal's gradient, and pdist differs from REALM
  in its retriever alone. (Every candidate weighted alike instead, as a
  Fusion-in-Decoder reader sees them, taught the world's reader to ignore
  what it reads: docs/levers.md.) The retriever's term reads the reader's
  likelihoods under a stop gradient.
  """
  valid = candidate_mask.astype(bool)
  reader = -marginal_log_likelihood(jax.lax.stop_gradient(log_p_z),
                                    log_p_y_given_z, mlm_mask, marginalize)
  fixed = jax.lax.stop_gradient(log_p_y_given_z)
  if signal == 'emdr2':
    return reader, -marginal_log_likelihood(log_p_z, fixed, mlm_mask,
                                            marginalize)
  tokens = jnp.sum(mlm_mask, axis=-1)[:, None]
  mean_log_likelihood = jnp.sum(jnp.where(mlm_mask[:, None, :], fixed, 0.0),
                                axis=-1) / jnp.maximum(tokens, 1)
  # A query with no masked token has no likelihood to distil.
  return reader, distillation_kl(log_p_z, mean_log_likelihood,
                                 valid & (tokens > 0), temperature)


def realm_mlm_loss(scores, candidate_mask, mlm_logits, mlm_targets, mlm_mask,
                   marginalize: Marginalization = 'per_token',
                   signal: RetrieverSignal = 'marginal',
                   signal_temperature: float = 0.01):
  """REALM's masked-LM loss and its metrics, the retriever trained by
  `signal`.

  'marginal' (the paper): -log p(y|x) per masked token, whose gradient to
  f(x, z) is r(z) = p(z|x,y) - p(z|x). 'emdr2' and 'pdist' (see the module
  docstring): the reader's term per masked token, plus the retriever's
  (emdr2's per masked token, pdist's KL per example); emdr2's gradient is
  the marginal's here (`_mlm_successor_terms`). The null document
  must be candidate 0; `retrieval_utility` compares the marginal against
  reading it alone, whatever the signal.

  Args:
    scores: [batch, k] f(x, z), recomputed with the current parameters.
    candidate_mask: [batch, k] bool; True on index 0 (the null document).
    mlm_logits: [batch, k, M, vocab] reader logits at the masked positions.
    mlm_targets: [batch, M] the original token ids.
    mlm_mask: [batch, M] 1 on real masked tokens.
    marginalize: see `marginal_log_likelihood` (emdr2's retriever term
      marginalizes so too).
    signal: 'marginal', 'emdr2' or 'pdist'.
    signal_temperature: pdist's temperature of q (Atlas: 0.01).

  Returns:
    (loss, metrics). Per masked token: loss, marginal_log_likelihood,
    masked_token_accuracy (argmax of the marginal p(y_j|x)) and
    retrieval_utility = log p(y|x) - log p(y|null, x). Per example:
    retrieval_entropy and retrieval_max_prob of p(z|x), and
    null_document_prob. The successors add reader_loss and retriever_loss.
  """
  terms = realm_mlm_per_example(scores, candidate_mask, mlm_logits,
                                mlm_targets, mlm_mask, marginalize)
  num_tokens = jnp.maximum(jnp.sum(terms['masked_tokens']), 1)
  marginal = jnp.sum(terms['log_likelihood']) / num_tokens
  p_z = terms['p_z']
  entropy = -jnp.sum(jax.scipy.special.xlogy(p_z, p_z), axis=-1)
  metrics = {
      'marginal_log_likelihood': marginal,
      'masked_token_accuracy': jnp.sum(terms['correct_tokens']) / num_tokens,
      'retrieval_utility': jnp.sum(terms['log_likelihood']
                                   - terms['null_log_likelihood'])
                           / num_tokens,
      'retrieval_entropy': jnp.mean(entropy),
      'retrieval_max_prob': jnp.mean(jnp.max(p_z, axis=-1)),
      'null_document_prob': jnp.mean(p_z[:, 0]),
  }
  if signal == 'marginal':
    return -marginal, {'loss': -marginal, **metrics}
  check_signal(signal, signal_temperature)
  reader, retriever = _mlm_successor_terms(
      candidate_log_probs(scores, candidate_mask),
      _token_log_probs(mlm_logits, mlm_targets)[1], candidate_mask,
      mlm_mask.astype(bool), marginalize, signal, signal_temperature)
  reader_loss = jnp.sum(reader) / num_tokens
  retriever_loss = (jnp.sum(retriever) / num_tokens if signal == 'emdr2'
                    else jnp.mean(retriever))
  loss = reader_loss + retriever_loss
  return loss, {'loss': loss, 'reader_loss': reader_loss,
                'retriever_loss': retriever_loss, **metrics}


def qa_loss(scores, candidate_mask, span_logits, span_mask, gold_span_mask,
            beam=None, signal: RetrieverSignal = 'marginal',
            signal_temperature: float = 0.01):
  """Open-QA fine-tuning loss (ORQA, as REALM fine-tunes).

  reader: -log [sum_{z, s gold} exp(S(z, s) + f(x, z)) /
                sum_{z, s} exp(S(z, s) + f(x, z))]
  retriever, by `signal`:
    'marginal' (ORQA, the paper): -log sum_{z containing an answer} p(z|x);
    'emdr2': -log sum_z p(z|x) sg(p(y|z,x));
    'pdist': KL(softmax_z sg(log p(y|z,x)) / temperature || p(z|x)),
  where p(y|z,x) = sum_{s gold} exp S(z, s) / sum_{s in z} exp S(z, s) is
  the reader's probability of an answer span within z. With a successor's
  signal the reader's term holds f(x, z) fixed, so that the retriever learns
  from its own term alone.
  Each term is 0 for an example whose candidates hold no answer.

  Args:
    scores: [batch, k] f(x, z).
    candidate_mask: [batch, k] bool.
    span_logits: [batch, k, L, W] reader score S(z, s) of span (i, i + w).
    span_mask: [batch, k, L, W] bool, spans that lie inside z.
    gold_span_mask: [batch, k, L, W] bool, spans equal to an answer.
    beam: None, or ORQA's retriever beam (f(x, z) [batch, n], mask
      [batch, n], has_answer [batch, n]): the retriever term's p(z|x) is
      then over the top n blocks, n >= k (ORQA: 5,000), not the k read,
      and it is 0 where none of the n holds an answer. 'marginal' only: the
      successors need the reader's likelihood of each block.
    signal / signal_temperature: as in `realm_mlm_loss`.

  Returns:
    (loss, metrics) with reader_loss, retriever_loss and answer_recall (the
    fraction of examples with an answer among their candidates; with a
    beam also beam_answer_recall, among the n).
  """
  if signal != 'marginal':
    check_signal(signal, signal_temperature)
    if beam is not None:
      raise ValueError(f'retriever_signal.name={signal!r} reads the reader '
                       'on every block it scores; a retriever beam scores '
                       'blocks the reader does not read.')
  valid = span_mask.astype(bool) & candidate_mask[:, :, None, None]
  gold = valid & gold_span_mask.astype(bool)
  prior = scores if signal == 'marginal' else jax.lax.stop_gradient(scores)
  joint = span_logits.astype(jnp.float32) + prior[:, :, None, None]
  axes = (1, 2, 3)
  has_answer = jnp.any(gold, axis=axes)
  log_normalizer = masked_logsumexp(joint, valid, axis=axes)
  reader_ll = masked_logsumexp(joint, gold, axis=axes) - log_normalizer
  reader_loss = -jnp.where(has_answer, reader_ll, 0.0)

  beam_scores, beam_mask, beam_gold = beam or (
      scores, candidate_mask, jnp.any(gold, axis=(2, 3)))
  beam_gold = beam_gold.astype(bool) & beam_mask
  beam_has_answer = jnp.any(beam_gold, axis=1)
  log_p_z = candidate_log_probs(beam_scores, beam_mask)
  if signal == 'marginal':
    retriever_loss = -jnp.where(
        beam_has_answer, masked_logsumexp(log_p_z, beam_gold, axis=1), 0.0)
  else:
    spans = span_logits.astype(jnp.float32)
    block_ll = jax.lax.stop_gradient(
        masked_logsumexp(spans, gold, axis=(2, 3))
        - masked_logsumexp(spans, valid, axis=(2, 3)))
    if signal == 'emdr2':
      retriever_loss = -jnp.where(beam_has_answer, masked_logsumexp(
          log_p_z + jnp.where(beam_gold, block_ll, 0.0), beam_gold, axis=1),
                                  0.0)
    else:
      retriever_loss = distillation_kl(log_p_z, block_ll, beam_gold,
                                       signal_temperature)
  loss = jnp.mean(reader_loss + retriever_loss)
  metrics = {
      'loss': loss,
      'reader_loss': jnp.mean(reader_loss),
      'retriever_loss': jnp.mean(retriever_loss),
      'answer_recall': jnp.mean(has_answer.astype(jnp.float32)),
  }
  if beam is not None:
    metrics['beam_answer_recall'] = jnp.mean(
        beam_has_answer.astype(jnp.float32))
  return loss, metrics


def ict_loss(query_embeddings, block_embeddings, axis_name=None):
  """Inverse Cloze Task: -log softmax over in-batch blocks (ORQA, eq. 4).

  Query i's positive is block i; every other block of the global batch is a
  negative. Inside shard_map/pmap pass the data axis as `axis_name`: the blocks
  of all shards are gathered so each query sees the global batch, and the loss
  is averaged over it. Under jit with sharded arrays, call without: the global
  matmul already gathers.

  Returns:
    (loss, metrics) with accuracy of the positive being the top block.
  """
  local = query_embeddings.shape[0]
  offset = 0
  if axis_name is not None:
    block_embeddings = jax.lax.all_gather(block_embeddings, axis_name,
                                          tiled=True)
    offset = jax.lax.axis_index(axis_name) * local
  logits = jnp.einsum('qd,bd->qb', query_embeddings, block_embeddings,
                      preferred_element_type=jnp.float32)
  labels = offset + jnp.arange(local)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  loss = -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))
  accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(
      jnp.float32))
  if axis_name is not None:
    loss, accuracy = jax.lax.pmean((loss, accuracy), axis_name)
  return loss, {'loss': loss, 'accuracy': accuracy}
