"""The neural knowledge retriever p(z|x) of REALM (Guu et al. 2020, eq. 1).

Embed(tokens) = LayerNorm(Dense_128(BERT_CLS(tokens))) (or of BERT's pooler
output, as in the released models, or of the mean of BERT's token states,
for weights trained that way); the relevance of a
document z to a query x is the inner product f(x, z) = Embed_input(x) .
Embed_doc(z). The query tower reads `[CLS] x [SEP]`, the document tower
`[CLS] title [SEP] body [SEP]`.
"""

import dataclasses

import jax.numpy as jnp
from flax import linen as nn

from realm_jax.models.bert import (Bert, BertConfig, dense, layer_norm,
                                   mean_pool)

POOLINGS = ('cls', 'pooler', 'mean')


class Embedder(nn.Module):
  """One tower: BERT's pooled state, projected to `projection_size` and normed.

  pooling 'cls' is the paper's ([CLS], as BERT is pre-trained); 'pooler' is
  the released models' (BERT's tanh(W [CLS] + b), its `pooler` parameters
  part of the tower); 'mean' suits
  sentence-transformer weights such as all-MiniLM-L6-v2, whose [CLS] state
  is nearly the same for every input (the index would collapse).
  """
  config: BertConfig
  projection_size: int = 128
  pooling: str = 'cls'

  def setup(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f'pooling={self.pooling!r}; expected one of '
                       f'{POOLINGS}.')
    c = self.config
    self.bert = Bert(dataclasses.replace(
        c, add_pooler=c.add_pooler or self.pooling == 'pooler'))
    # The product is the compute dtype's; the embedding stays float32 from
    # there on: the index stores it, and f(x, z) is a softmax's input.
    self.projection = dense(c, self.projection_size, ('embed', 'projection'),
                            'projection', dtype=jnp.float32)
    self.layer_norm = layer_norm(c, 'layer_norm', 'projection',
                                 dtype=jnp.float32)

  def __call__(self, token_ids, input_mask, token_type_ids,
               deterministic: bool = True):
    """[..., length] tokens -> [..., projection_size] float32 embeddings."""
    lead = token_ids.shape[:-1]
    flat = lambda x: x.reshape(-1, x.shape[-1])
    out = self.bert(flat(token_ids), flat(input_mask), flat(token_type_ids),
                    deterministic)
    if self.pooling == 'pooler':
      pooled = out.pooled_output
    elif self.pooling == 'cls':
      pooled = out.sequence_output[:, 0]
    else:
      pooled = mean_pool(out.sequence_output, flat(input_mask))
    embedding = self.layer_norm(self.projection(pooled))
    return embedding.reshape(*lead, -1)


class Retriever(nn.Module):
  """Query and document towers; `share_towers` uses one Embedder for both.

  The released REALM/ORQA code shares one BERT and projection between the
  towers; the paper counts separate ones (330M parameters with the reader).
  """
  config: BertConfig
  projection_size: int = 128
  share_towers: bool = True
  pooling: str = 'cls'

  def setup(self):
    tower = lambda: Embedder(self.config, self.projection_size, self.pooling)
    if self.share_towers:
      self.embedder = tower()
    else:
      self.query_embedder = tower()
      self.document_embedder = tower()

  def embed_query(self, token_ids, input_mask, token_type_ids,
                  deterministic: bool = True):
    tower = self.embedder if self.share_towers else self.query_embedder
    return tower(token_ids, input_mask, token_type_ids, deterministic)

  def embed_documents(self, token_ids, input_mask, token_type_ids,
                      deterministic: bool = True):
    tower = self.embedder if self.share_towers else self.document_embedder
    return tower(token_ids, input_mask, token_type_ids, deterministic)

  def __call__(self, query, documents, deterministic: bool = True):
    """Relevance f(x, z) of each query's candidates.

    Args:
      query: dict of token_ids/input_mask/token_type_ids, each [batch, Lq].
      documents: the same keys, each [batch, k, Ld] (candidate blocks).

    Returns:
      [batch, k] float32 inner products.
    """
    keys = ('token_ids', 'input_mask', 'token_type_ids')
    query_embedding = self.embed_query(*(query[k] for k in keys),
                                       deterministic=deterministic)
    document_embedding = self.embed_documents(*(documents[k] for k in keys),
                                              deterministic=deterministic)
    return relevance(query_embedding, document_embedding)


def relevance(query_embedding, document_embedding):
  """f(x, z): [batch, D] . [batch, k, D] -> [batch, k]."""
  return jnp.einsum('bd,bkd->bk', query_embedding, document_embedding)


def init_retriever_params(retriever: Retriever, rng, bert_params=None,
                          query_length: int = 8, document_length: int = 8):
  """Fresh retriever parameters; each tower's BERT replaced by `bert_params`.

  The warm start of the paper's towers from pretrained BERT (the projection
  and its LayerNorm start fresh).
  """
  ones = lambda *shape: {k: jnp.ones(shape, jnp.int32) for k in (
      'token_ids', 'input_mask', 'token_type_ids')}
  params = nn.meta.unbox(retriever.init(
      rng, ones(1, query_length), ones(1, 1, document_length)))['params']
  if bert_params is not None:
    params = {tower: {**tree, 'bert': bert_params}
              for tower, tree in params.items()}
  return params
