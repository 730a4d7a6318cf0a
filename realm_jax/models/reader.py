"""The knowledge-augmented encoder p(y|z,x) of REALM (Guu et al. 2020, §3.2).

A BERT of its own reads `[CLS] x [SEP] z_body [SEP]` for every candidate z.
Pre-training puts BERT's masked-LM head on the masked query positions;
fine-tuning puts ORQA's span reader on the positions of z.
"""

import jax.numpy as jnp
from flax import linen as nn

from realm_jax.models.bert import Bert, BertConfig, dense, layer_norm


# How an Open-QA answer is read off the span scores (evaluation.answers):
# REALM section 3.2's marginal p(y|x), or ORQA's best span of f + S.
MARGINAL, BEST_SPAN = 'marginal', 'best_span'
ANSWER_RULES = (MARGINAL, BEST_SPAN)


def check_answer_rule(rule: str) -> str:
  if rule not in ANSWER_RULES:
    raise ValueError(f'answer_rule={rule!r}: expected one of {ANSWER_RULES}.')
  return rule


def gather_positions(hidden, positions):
  """[n, L, H] states at [n, M] positions -> [n, M, H]."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MaskedLMHead(nn.Module):
  """BERT's MLM head: dense + activation + LayerNorm, decoder tied to the
  embeddings."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden, bert: Bert):
    c = self.config
    h = dense(c, c.hidden_size, ('embed', 'mlp'), 'transform')(hidden)
    h = layer_norm(c, 'transform_layer_norm', 'mlp')(
        c.activation(h))
    bias = self.param('output_bias', nn.with_logical_partitioning(
        nn.initializers.zeros, ('vocab',)), (c.vocab_size,), c.param_dtype)
    logits = bert.attend(h) + bias
    return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))


class SpanReaderHead(nn.Module):
  """ORQA's span scorer: Dense_1(LayerNorm(ReLU(start_i + end_j))).

  Scores every span of at most `max_span_width` tokens as a [.., L, W] grid:
  entry (i, w) is the span from position i to position i + w.
  """
  config: BertConfig
  projection_size: int = 256
  max_span_width: int = 10
  layer_norm_eps: float | None = None

  @nn.compact
  def __call__(self, hidden):
    c = self.config
    start = dense(c, self.projection_size, ('embed', 'mlp'), 'start')(hidden)
    end = dense(c, self.projection_size, ('embed', 'mlp'), 'end')(hidden)
    length = hidden.shape[-2]
    # ends[:, i, w] = end state of position i + w (clamped; masked later).
    end_index = jnp.minimum(
        jnp.arange(length)[:, None] + jnp.arange(self.max_span_width)[None],
        length - 1)
    spans = start[:, :, None, :] + end[:, end_index, :]
    spans = layer_norm(c, 'layer_norm', 'mlp', self.layer_norm_eps)(
        nn.relu(spans))
    return dense(c, 1, ('mlp', 'score'), 'score', dtype=jnp.float32)(
        spans)[..., 0]


def span_mask(block_mask, max_span_width: int):
  """[n, L] mask of z's body tokens -> [n, L, W] mask of spans inside it."""
  length = block_mask.shape[-1]
  end = jnp.arange(length)[:, None] + jnp.arange(max_span_width)[None]
  inside = jnp.take(block_mask.astype(bool), jnp.minimum(end, length - 1),
                    axis=-1) & (end < length)
  # A span is valid when every token of it is in z; z's tokens are contiguous,
  # so start and end inside suffice.
  return block_mask.astype(bool)[..., None] & inside


class KnowledgeAugmentedEncoder(nn.Module):
  """p(y|z,x): BERT over the joined query and candidate, plus task heads."""
  config: BertConfig
  span_projection_size: int = 256
  max_span_width: int = 10
  span_layer_norm_eps: float | None = None

  def setup(self):
    self.bert = Bert(self.config)
    self.mlm_head = MaskedLMHead(self.config)
    self.span_head = SpanReaderHead(self.config, self.span_projection_size,
                                    self.max_span_width,
                                    self.span_layer_norm_eps)

  def _encode(self, inputs, deterministic):
    flat = lambda x: x.reshape(-1, x.shape[-1])
    return self.bert(flat(inputs['token_ids']), flat(inputs['input_mask']),
                     flat(inputs['token_type_ids']),
                     deterministic).sequence_output

  def _mlm(self, hidden, mlm_positions, batch, k):
    positions = jnp.repeat(mlm_positions, k, axis=0)
    logits = self.mlm_head(gather_positions(hidden, positions), self.bert)
    return logits.reshape(batch, k, *logits.shape[1:])

  def _spans(self, hidden, batch, k):
    scores = self.span_head(hidden)
    return scores.reshape(batch, k, *scores.shape[1:])

  def masked_lm_logits(self, inputs, mlm_positions, deterministic=True):
    """Vocabulary logits at the masked positions of every candidate input.

    Args:
      inputs: token_ids/input_mask/token_type_ids, each [batch, k, L].
      mlm_positions: [batch, M] positions of the masked tokens in x (the same
        in every candidate input, since x comes first).

    Returns:
      [batch, k, M, vocab] float32 logits.
    """
    batch, k = inputs['token_ids'].shape[:2]
    return self._mlm(self._encode(inputs, deterministic), mlm_positions, batch,
                     k)

  def span_logits(self, inputs, deterministic=True):
    """[batch, k, L, W] scores of every span (i, i + w) of every input."""
    batch, k = inputs['token_ids'].shape[:2]
    return self._spans(self._encode(inputs, deterministic), batch, k)

  def __call__(self, inputs, mlm_positions, deterministic=True):
    """Both heads over one encoding (initializes every parameter)."""
    batch, k = inputs['token_ids'].shape[:2]
    hidden = self._encode(inputs, deterministic)
    return (self._mlm(hidden, mlm_positions, batch, k),
            self._spans(hidden, batch, k))



def gold_span_mask(token_ids, block_mask, answer_ids, answer_mask,
                   max_span_width: int):
  """Every occurrence of an answer's token ids inside z, as a span grid.

  Args:
    token_ids: [batch, k, L] reader inputs.
    block_mask: [batch, k, L] 1 on the tokens of z.
    answer_ids: [batch, A, T] token ids of each answer, padded.
    answer_mask: [batch, A, T] 1 on real answer tokens.
    max_span_width: W; longer answers can never be gold.

  Returns:
    [batch, k, L, W] bool: span (i, i + w) spells an answer and lies in z.
  """
  length, answer_length = token_ids.shape[-1], answer_ids.shape[-1]
  offsets = jnp.arange(length)[:, None] + jnp.arange(answer_length)[None]
  window = jnp.minimum(offsets, length - 1)  # [L, T]
  in_block = block_mask.astype(bool)[..., window] & (offsets < length)
  answer_mask = answer_mask.astype(bool)
  same = token_ids[..., window][:, :, :, None, :] == answer_ids[:, None, None]
  same &= in_block[:, :, :, None, :]
  match = jnp.all(same | ~answer_mask[:, None, None], axis=-1) & jnp.any(
      answer_mask, axis=-1)[:, None, None]  # [batch, k, L, A]
  width = jnp.sum(answer_mask, axis=-1) - 1  # [batch, A]
  widths = width[..., None] == jnp.arange(max_span_width)  # [batch, A, W]
  return jnp.any(match[..., None] & widths[:, None, None], axis=3)
