"""What each run kind optimizes: pure functions of parameters and inputs.

An objective, in the spirit of t5x's `BaseModel`, holds the Flax modules of
one run kind, initializes their parameters, computes the loss of a batch of
prepared inputs, describes those inputs as shapes, and says which parameters
stay frozen. It reads no file and no index: retrieval is the batch
preparer's (`step_inputs`), warm starts are `warm_start`'s. So the step compiles
ahead of time from an objective alone (`aot`), and this module imports
neither TensorFlow nor seqio.
"""

import jax
import jax.numpy as jnp

from realm_jax.models import losses
from realm_jax.models.reader import gold_span_mask, span_mask
from realm_jax.models.realm import Realm
from realm_jax.models.retriever import Retriever

TOKEN_KEYS = ('token_ids', 'input_mask', 'token_type_ids')


def _ones(*shape) -> dict:
  return {k: jnp.ones(shape, jnp.int32) for k in TOKEN_KEYS}


def _abstract(shape, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype)


def _abstract_tokens(*shape) -> dict:
  """What `step_inputs.token_arrays` gives, as shapes."""
  return {k: _abstract(shape) for k in TOKEN_KEYS}


class Objective:
  """Init, loss and input shapes of one run kind.

  Attributes:
    microbatches: slices the step trains a batch in, one at a time (see
      `Trainer`): for the kinds whose loss is a mean over examples, where
      the mean of the slices' means stands in for it. ICT's in-batch
      negatives need the whole batch.
  """

  def __init__(self, microbatches: int = 1):
    self.microbatches = microbatches

  def init(self, rng):
    """Boxed (logically partitioned) fresh parameters."""
    raise NotImplementedError

  def loss(self, params, inputs, rng, deterministic: bool):
    """(loss, metrics) of a batch of prepared inputs."""
    raise NotImplementedError

  def abstract_inputs(self, batch_size: int, block_length: int) -> dict:
    """Shapes and dtypes of the prepared inputs of a global batch, for
    lowering the step ahead of time (`block_length`: the corpus' blocks)."""
    raise NotImplementedError

  def frozen(self, params):
    """A bool tree, True where a parameter must not train; None: all do."""
    del params
    return None

  def bert_configs(self) -> tuple:
    """The BertConfig of each BERT the objective trains."""
    raise NotImplementedError


class InverseCloze(Objective):
  """ICT: each pseudo-query against the batch's blocks (ORQA's warm start)."""

  def __init__(self, retriever: Retriever, query_length: int,
               block_length: int):
    super().__init__()
    self.retriever = retriever
    self.query_length, self.block_length = query_length, block_length

  def bert_configs(self):
    return (self.retriever.config,)

  def init(self, rng):
    return {'retriever': self.retriever.init(rng, _ones(1, 8),
                                             _ones(1, 1, 8))['params']}

  def abstract_inputs(self, batch_size, block_length):
    del block_length  # ICT reads its own, fixed length.
    return {'query': _abstract_tokens(batch_size, self.query_length),
            'block': _abstract_tokens(batch_size, self.block_length)}

  def loss(self, params, inputs, rng, deterministic):
    apply = lambda method, x: self.retriever.apply(
        {'params': params['retriever']}, *(x[k] for k in TOKEN_KEYS),
        deterministic=deterministic, rngs={'dropout': rng}, method=method)
    return losses.ict_loss(apply('embed_query', inputs['query']),
                           apply('embed_documents', inputs['block']))


class _ReadsCandidates(Objective):
  """Shared by the kinds whose reader reads retrieved blocks."""

  def __init__(self, model: Realm, query_length: int, num_candidates: int,
               block_length: int | None, microbatches: int):
    super().__init__(microbatches)
    self.model = model
    self.query_length, self.num_candidates = query_length, num_candidates
    self.block_length = block_length

  def bert_configs(self):
    return (self.model.retriever_config, self.model.reader_config)

  def init(self, rng):
    q, k = 8, 2
    return self.model.init(rng, _ones(1, q), _ones(1, k, q),
                           jnp.zeros((1, 1), jnp.int32))['params']

  def _abstract_candidates(self, batch_size, block_length) -> dict:
    k = self.num_candidates
    return {'query': _abstract_tokens(batch_size, self.query_length),
            'candidates': _abstract_tokens(batch_size, k,
                                           self.block_length or block_length),
            'candidate_mask': _abstract((batch_size, k), bool)}


class MarginalMaskedLm(_ReadsCandidates):
  """REALM pre-training: the masked LM marginalized over the candidates.

  Attributes:
    marginalize: 'per_token' (released code) or 'whole_span' (paper eq. 2).
    null_score_offset: None scores the null document by the document
      tower, as the paper does; a number d scores it max_z f(x, z) - d (see
      `losses.null_score_below_best`).
    train_retriever: False keeps both towers at their start (`frozen`),
      and scores the candidates by their embeddings in the index those
      towers embedded (`reads_index_embeddings`), as fine-tuning does: the
      document tower is not run at all.
    signal / signal_temperature: the retriever's training signal
      (`losses.realm_mlm_loss`). With one candidate p(z|x) = 1 and every
      signal is the marginal, which is then used.
  """

  def __init__(self, model: Realm, query_length: int, max_masked: int,
               num_candidates: int, block_length: int | None,
               marginalize: losses.Marginalization,
               null_score_offset: float | None, microbatches: int = 1,
               train_retriever: bool = True,
               signal: losses.RetrieverSignal = 'marginal',
               signal_temperature: float = 0.01):
    super().__init__(model, query_length, num_candidates, block_length,
                     microbatches)
    self.max_masked, self.marginalize = max_masked, marginalize
    self.null_score_offset = null_score_offset
    self.train_retriever = train_retriever
    self.signal = signal if num_candidates > 1 else 'marginal'
    self.signal_temperature = signal_temperature

  def frozen(self, params):
    if self.train_retriever:
      return None
    return {name: jax.tree.map(lambda _, n=name: n == 'retriever', tree)
            for name, tree in params.items()}

  @property
  def reads_index_embeddings(self) -> bool:
    """Whether the inputs carry 'candidate_embeddings' [batch, k, D]: the
    candidates' rows of the index, the null document's embedded apart."""
    return not self.train_retriever and self.num_candidates > 1

  def abstract_inputs(self, batch_size, block_length):
    masked = (batch_size, self.max_masked)
    embeddings = ({'candidate_embeddings': _abstract(
        (batch_size, self.num_candidates, self.model.projection_size),
        jnp.float32)} if self.reads_index_embeddings else {})
    return {**self._abstract_candidates(batch_size, block_length),
            **embeddings, 'mlm_positions': _abstract(masked),
            'mlm_targets': _abstract(masked), 'mlm_mask': _abstract(masked)}

  def _outputs(self, params, inputs, rng, deterministic):
    scores, logits = self.model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        inputs['mlm_positions'], deterministic,
        inputs.get('candidate_embeddings'), rngs={'dropout': rng},
        method='pretrain')
    if self.null_score_offset is not None and scores.shape[1] > 1:
      scores = losses.null_score_below_best(scores, inputs['candidate_mask'],
                                            self.null_score_offset)
    return (scores, inputs['candidate_mask'], logits, inputs['mlm_targets'],
            inputs['mlm_mask'], self.marginalize)

  def loss(self, params, inputs, rng, deterministic):
    return losses.realm_mlm_loss(
        *self._outputs(params, inputs, rng, deterministic),
        signal=self.signal, signal_temperature=self.signal_temperature)

  def per_example(self, params, inputs):
    """Held-out terms of each query (see `losses.realm_mlm_per_example`)."""
    return losses.realm_mlm_per_example(*self._outputs(
        params, inputs, jax.random.PRNGKey(0), True))


class SpanQa(_ReadsCandidates):
  """Open-QA fine-tuning: the answer spans marginalized over the top-k
  blocks, with the masked-LM head frozen.

  train_document_tower: False (ORQA, the paper) scores the candidates by
  the index's document embeddings, given in the inputs as
  'candidate_embeddings', and keeps the document tower frozen; True embeds
  them afresh, so the loss trains the document tower too (EMDR2, Atlas),
  and the index must be refreshed as in pre-training.
  retriever_beam_size: None, or ORQA's n >= k: the retriever's loss is
  over the top n blocks (those whose wordpieces hold an answer), the reader
  still reads the top k. Its inputs then carry the n blocks' embeddings
  (the first k are the read candidates'), 'beam_mask' and
  'beam_has_answer' [batch, n].
  signal / signal_temperature: the retriever's training signal
  (`losses.qa_loss`).
  """

  def __init__(self, model: Realm, query_length: int, max_answers: int,
               max_answer_length: int, num_candidates: int,
               block_length: int | None, microbatches: int = 1,
               retriever_beam_size: int | None = None,
               train_document_tower: bool = False,
               signal: losses.RetrieverSignal = 'marginal',
               signal_temperature: float = 0.01):
    if train_document_tower and retriever_beam_size:
      # The n - k blocks not read have no wordpieces in the inputs to embed.
      raise ValueError('A retriever beam scores blocks by the frozen index, '
                       'so it cannot train the document tower: bind '
                       'Finetune.retriever_beam_size or '
                       'Finetune.train_document_tower, not both.')
    super().__init__(model, query_length, num_candidates, block_length,
                     microbatches)
    self.max_answers, self.max_answer_length = max_answers, max_answer_length
    self.retriever_beam_size = retriever_beam_size
    self.train_document_tower = train_document_tower
    self.signal, self.signal_temperature = signal, signal_temperature

  @property
  def retrieved(self) -> int:
    """Blocks retrieved per question: the beam, or the k read."""
    return self.retriever_beam_size or self.num_candidates

  def abstract_inputs(self, batch_size, block_length):
    answers = (batch_size, self.max_answers, self.max_answer_length)
    beam = ({'beam_mask': _abstract((batch_size, self.retrieved), bool),
             'beam_has_answer': _abstract((batch_size, self.retrieved), bool)}
            if self.retriever_beam_size else {})
    embeddings = ({} if self.train_document_tower else
                  {'candidate_embeddings': _abstract(
                      (batch_size, self.retrieved,
                       self.model.projection_size), jnp.float32)})
    return {**self._abstract_candidates(batch_size, block_length),
            **embeddings, 'answer_token_ids': _abstract(answers),
            'answer_mask': _abstract(answers), **beam}

  def frozen(self, params):
    frozen = jax.tree.map(lambda _: False, params)
    frozen['reader']['mlm_head'] = jax.tree.map(
        lambda _: True, params['reader']['mlm_head'])
    if (not self.train_document_tower
        and 'document_embedder' in params['retriever']):
      frozen['retriever']['document_embedder'] = jax.tree.map(
          lambda _: True, params['retriever']['document_embedder'])
    return frozen

  def loss(self, params, inputs, rng, deterministic):
    scores, spans, reader_inputs = self.model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        None if self.train_document_tower else inputs['candidate_embeddings'],
        deterministic, rngs={'dropout': rng}, method='read_spans')
    width, k = self.model.max_span_width, self.num_candidates
    # Inputs of the k read alone (the t5x adapter's loss_fn) score the
    # retriever over those.
    beam = ((scores, inputs['beam_mask'], inputs['beam_has_answer'])
            if 'beam_has_answer' in inputs else None)
    return losses.qa_loss(
        scores[:, :k], inputs['candidate_mask'], spans,
        span_mask(reader_inputs['block_mask'], width),
        gold_span_mask(reader_inputs['token_ids'], reader_inputs['block_mask'],
                       inputs['answer_token_ids'], inputs['answer_mask'],
                       width), beam, self.signal, self.signal_temperature)
