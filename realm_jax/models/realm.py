"""REALM: p(y|x) = sum_z p(y|z,x) p(z|x) over the candidates of each query.

Ties the retriever and the knowledge-augmented encoder together. Candidate
blocks arrive as token arrays (see `candidates.gather_blocks`); their
embeddings are recomputed here with the current parameters, so the gradient
reaches the document tower even though the index that found them is stale.
"""

import gin
import jax.numpy as jnp
from flax import linen as nn

from realm_jax.models.bert import BertConfig
from realm_jax.models.candidates import join_query_and_blocks
from realm_jax.models.reader import KnowledgeAugmentedEncoder
from realm_jax.models.retriever import Retriever, relevance


class Realm(nn.Module):
  """Retriever + knowledge-augmented encoder.

  Attributes:
    retriever_config: BERT of the query/document towers.
    reader_config: BERT of the knowledge-augmented encoder.
    projection_size: retrieval embedding size (128 in the paper).
    share_towers: one BERT for query and document towers (released code).
    retriever_pooling: 'cls' (the paper), 'pooler' (the released models:
      BERT's pooler output) or 'mean' (sentence-transformer weights, e.g.
      MiniLM).
    reader_length: wordpieces of `[CLS] x [SEP] z [SEP]` (384; 320 for QA).
    include_title: the reader also reads z's title.
    span_projection_size: ORQA's start/end projection size (256).
    max_span_width: longest answer span in tokens (10).
    span_layer_norm_eps: epsilon of the span scorer's LayerNorm; None takes
      BERT's (1e-12); the released ORQA reader uses 1e-3.
    retrieval_temperature: tau in p(z|x) = softmax_z f(x, z) / tau. 1 is the
      paper's raw inner product; sqrt(projection_size) is EMDR2's score
      scaling. The ranking, hence the index and its search, is the same for
      every tau; only p(z|x) and its gradient r(z) spread or sharpen.
  """
  retriever_config: BertConfig
  reader_config: BertConfig
  projection_size: int = 128
  share_towers: bool = True
  retriever_pooling: str = 'cls'
  reader_length: int = 384
  include_title: bool = False
  span_projection_size: int = 256
  max_span_width: int = 10
  span_layer_norm_eps: float | None = None
  retrieval_temperature: float = 1.0

  def setup(self):
    if not self.retrieval_temperature > 0:
      raise ValueError(f'build_realm.retrieval_temperature='
                       f'{self.retrieval_temperature}; expected > 0.')
    self.retriever = Retriever(self.retriever_config, self.projection_size,
                               self.share_towers, self.retriever_pooling)
    self.reader = KnowledgeAugmentedEncoder(
        self.reader_config, self.span_projection_size, self.max_span_width,
        self.span_layer_norm_eps)

  def relevance(self, query, candidates, deterministic=True):
    """f(x, z) / tau [batch, k], the candidates embedded afresh."""
    return self.retriever(query, candidates,
                          deterministic) / self.retrieval_temperature

  def reader_inputs(self, query, candidates):
    return join_query_and_blocks(query, candidates, self.reader_length,
                                 self.include_title)

  def pretrain(self, query, candidates, mlm_positions, deterministic=True,
               candidate_embeddings=None):
    """Masked LM: (f(x, z) / tau [batch, k], logits [batch, k, M, vocab]).

    With one candidate (the null document alone: the no-retrieval baseline)
    p(z|x) = 1 whatever f(x, z) is, so the towers are skipped and f is 0.
    `candidate_embeddings` [batch, k, D]: the candidates' embeddings as the
    index holds them, when the document tower that embedded them is the
    one scored (frozen towers, or a step scored with its own index); None
    embeds them afresh.
    """
    if candidates['token_ids'].shape[1] == 1:
      scores = jnp.zeros(candidates['token_ids'].shape[:2], jnp.float32)
    else:
      scores = self._scores(query, candidates, candidate_embeddings,
                            deterministic)
    logits = self.reader.masked_lm_logits(
        self.reader_inputs(query, candidates), mlm_positions, deterministic)
    return scores, logits

  def _scores(self, query, candidates, candidate_embeddings, deterministic):
    """f(x, z) / tau: of the embeddings given, else of the candidates
    embedded afresh."""
    if candidate_embeddings is None:
      return self.relevance(query, candidates, deterministic)
    return relevance(self.retriever.embed_query(
        query['token_ids'], query['input_mask'], query['token_type_ids'],
        deterministic), candidate_embeddings) / self.retrieval_temperature

  def read_spans(self, query, candidates, candidate_embeddings=None,
                 deterministic=True):
    """Open-QA: (f(x, z) / tau [batch, n], span logits [batch, k, L, W], the
    reader inputs, whose `block_mask` locates z for span masks and gold
    spans).

    `candidate_embeddings` [batch, n, D], n >= k: the document embeddings
    of the index, frozen (ORQA, the paper's fine-tuning): the k candidates'
    first, then any more blocks scored but not read (ORQA's retriever
    beam). None embeds the k candidates afresh with the document tower, so
    that it trains too (end-to-end fine-tuning: EMDR2, Atlas).
    """
    inputs = self.reader_inputs(query, candidates)
    scores = self._scores(query, candidates, candidate_embeddings,
                          deterministic)
    return scores, self.reader.span_logits(inputs, deterministic), inputs

  def __call__(self, query, candidates, mlm_positions, deterministic=True):
    """Every parameter, for init: both towers and both reader heads."""
    scores = self.relevance(query, candidates, deterministic)
    logits, spans = self.reader(self.reader_inputs(query, candidates),
                                mlm_positions, deterministic)
    return scores, logits, spans


@gin.configurable
def build_realm(retriever_config: BertConfig | None = None,
                reader_config: BertConfig | None = None, **kwargs) -> Realm:
  """The gin entry point: `Realm` with BERT-base towers unless configured."""
  return Realm(retriever_config or BertConfig(), reader_config or BertConfig(),
               **kwargs)


def model_retriever(realm: Realm | None = None) -> Retriever:
  """The retriever alone of `realm` (default the gin-configured model): what
  the index builder embeds with and the trainer embeds queries with."""
  realm = realm or build_realm()
  return Retriever(realm.retriever_config, realm.projection_size,
                   realm.share_towers, realm.retriever_pooling)
