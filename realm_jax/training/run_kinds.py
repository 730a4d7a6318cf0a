"""The three things the one train loop trains: ICT, REALM pre-training, Open-QA.

A run kind says which seqio task feeds it and at which shapes, how its
parameters start (warm starts), how a host batch becomes the step's inputs
(retrieval happens here, see `retrieval`), its loss, and which parameters stay
frozen. Parameters are always {'retriever': ..., 'reader': ...} (ICT has no
reader), so every checkpoint's `retriever_params` item is what the index
builder and the next run's warm start read.
"""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio

from realm_jax import embedded
from realm_jax.data import corpus
from realm_jax.index import publication
from realm_jax.index.refresh import model_retriever
from realm_jax.models import losses, pretrained
from realm_jax.models.candidates import NULL_DOCUMENT_ID
from realm_jax.models.reader import gold_span_mask, span_mask
from realm_jax.models.realm import Realm, build_realm
from realm_jax.training import checkpoints, partitioning
from realm_jax.training.retrieval import CandidateRetrieval

_KEYS = ('token_ids', 'input_mask', 'token_type_ids')


def token_arrays(token_ids, token_type_ids=None) -> dict:
  """token_ids/input_mask/token_type_ids of zero-padded wordpieces."""
  token_ids = np.asarray(token_ids, np.int32)
  return {'token_ids': token_ids,
          'input_mask': (token_ids != 0).astype(np.int32),
          'token_type_ids': (np.zeros_like(token_ids) if token_type_ids is None
                             else np.asarray(token_type_ids, np.int32))}


def _ones(*shape) -> dict:
  return {k: jnp.ones(shape, jnp.int32) for k in _KEYS}


def _abstract(shape, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype)


def _abstract_tokens(*shape) -> dict:
  """What `token_arrays` gives, as shapes."""
  return {k: _abstract(shape) for k in _KEYS}


def _with_bert(tree, bert):
  """Replaces every 'bert' sub-tree (each tower, the reader) by `bert`."""
  if not isinstance(tree, dict):
    return tree
  return {k: (bert if k == 'bert' else _with_bert(v, bert))
          for k, v in tree.items()}


def _bert_warm_start(params, bert_dir: str | None, retriever_config,
                     reader_config=None):
  """Every BERT of `params` (the towers at `retriever_config`'s size, the
  reader at `reader_config`'s) from pretrained weights; bert_dir '' keeps
  the fresh ones (a model size with no pretrained weights)."""
  if bert_dir == '':
    return params
  load = lambda config: pretrained.load_bert_params(
      bert_dir or embedded.minilm_dir(), config)
  towers = load(retriever_config)
  reader = (towers if reader_config in (None, retriever_config)
            else load(reader_config))
  return {k: _with_bert(v, reader if k == 'reader' else towers)
          for k, v in params.items()}


def _ict_retriever(params, ict_model_dir: str):
  """`params` with the retriever of an ICT run's last checkpoint, and that
  run's (model_dir, step), whose index the new run can start from."""
  step, ict = checkpoints.restore_params(ict_model_dir)
  print(f'retriever warm-started from ICT step {step} of {ict_model_dir}',
        flush=True)
  return {**params, 'retriever': ict['retriever']}, (ict_model_dir, step)


class RunKind:
  """What differs between ICT, pre-training and fine-tuning."""
  task: str
  eval_split: str
  shapes: dict
  # params -> bool tree, True where a parameter must not train; None: all do.
  frozen = None
  # Slices the step trains a batch in, one at a time (see Trainer): for the
  # kinds whose loss is a mean over examples, where the mean of the slices'
  # means stands in for it. ICT's in-batch negatives need the whole batch.
  microbatches = 1

  def setup(self, model_dir: str, mesh) -> None:
    """The model, and what the run reads and writes (data, index)."""
    self.model_dir, self.mesh = model_dir, mesh
    self.build_model()

  def build_model(self) -> None:
    """The Flax modules alone (no data): enough to compile the step."""
    raise NotImplementedError

  def abstract_inputs(self, batch_size: int, block_length: int) -> dict:
    """Shapes and dtypes of what `prepare` gives for a global batch, for
    lowering the step ahead of time (`block_length`: the corpus' blocks)."""
    raise NotImplementedError

  def init(self, rng):
    """Boxed (logically partitioned) fresh parameters."""
    raise NotImplementedError

  def warm_start(self, params):
    return params

  def prepare(self, examples: dict, params, step: int):
    """(the step's inputs, host metrics) from one host batch of examples,
    retrieving with `params` (after `step` updates)."""
    return self.dispatch_prepare(examples, params, step)()

  def dispatch_prepare(self, examples: dict, params, step: int):
    """`prepare` in two parts: its device work (the query embedding, an
    exact search) queued now; the returned function does the host's share
    and gives what `prepare` gives. The train loop queues the next batch's
    device work before a step and does its host share during the step."""
    raise NotImplementedError

  def loss(self, params, inputs, rng, deterministic: bool):
    raise NotImplementedError

  def start(self, params, step: int) -> None:
    """Called once the parameters exist, before the first batch."""

  def finish(self) -> None:
    """Called once training is done."""


class _Retrieving(RunKind):
  """Shared by the kinds that read retrieved blocks (pre-training, Open-QA)."""
  model: Realm
  retrieval: CandidateRetrieval

  def build_model(self):
    self.model = build_realm()

  def _setup_retrieval(self, corpus_name: str, num_candidates: int,
                       null_document_first: bool, exclude_source: bool,
                       block_length: int | None):
    tokenizer = seqio.get_mixture_or_task(self.task).output_features[
        'query_token_ids'].vocabulary.tokenizer
    self.tokenizer = tokenizer
    self.retrieval = CandidateRetrieval(
        self.model_dir, corpus.corpus_dir(corpus_name),
        self.model.projection_size, num_candidates, null_document_first,
        exclude_source, tokenizer.cls_id, tokenizer.sep_id, block_length)
    self.retriever = retriever = model_retriever()
    data = partitioning.batch_sharding(self.mesh)
    self._embed_query = jax.jit(
        lambda params, query: retriever.apply(
            {'params': params}, *(query[k] for k in _KEYS),
            method='embed_query'),
        in_shardings=(None, data), out_shardings=data)

  def init(self, rng):
    q, k = 8, 2
    return self.model.init(rng, _ones(1, q), _ones(1, k, q),
                           jnp.zeros((1, 1), jnp.int32))['params']

  def query_embeddings(self, params, query) -> np.ndarray:
    embedded_query = self._embed_query(
        params['retriever'], partitioning.global_batch(query, self.mesh))
    return partitioning.local_rows(embedded_query, self.mesh)

  # (model_dir, step) of the run whose parameters this one started from; its
  # index of that step, if published, is this run's first index.
  warm_index: tuple[str, int] | None = None

  def start(self, params, step):
    if not self.retrieval.fetch:
      return  # The null document alone: no index to read.
    self.retrieval.ensure_index(step, self.retriever, params['retriever'],
                                self.warm_index if step == 0 else None)


@gin.configurable
class Ict(RunKind):
  """Inverse Cloze Task: the retriever's warm start (ORQA; REALM section 3.4).

  Attributes:
    corpus_name: which corpus' blocks make the pseudo-queries.
    query_length / block_length: 64 / 288 in the paper.
    bert_dir: BERT weights for both towers (default: the embedded MiniLM;
      '' for none).
  """

  def __init__(self, corpus_name: str = 'wiki_leads', query_length: int = 64,
               block_length: int = 288, bert_dir: str | None = None):
    self.task = f'ict_{corpus_name}'
    self.eval_split = 'validation'
    self.shapes = {'query_token_ids': (query_length,),
                   'block_token_ids': (block_length,),
                   'block_token_type_ids': (block_length,)}
    self.bert_dir = bert_dir

  def build_model(self):
    self.retriever = model_retriever()

  def abstract_inputs(self, batch_size, block_length):
    del block_length  # ICT reads its own, fixed length.
    return {'query': _abstract_tokens(batch_size,
                                      self.shapes['query_token_ids'][0]),
            'block': _abstract_tokens(batch_size,
                                      self.shapes['block_token_ids'][0])}

  def init(self, rng):
    return {'retriever': self.retriever.init(rng, _ones(1, 8),
                                             _ones(1, 1, 8))['params']}

  def warm_start(self, params):
    return _bert_warm_start(params, self.bert_dir, self.retriever.config)

  def dispatch_prepare(self, examples, params, step):
    del params, step  # In-batch negatives: nothing is retrieved.
    inputs = {'query': token_arrays(examples['query_token_ids']),
              'block': token_arrays(examples['block_token_ids'],
                                    examples['block_token_type_ids'])}
    return lambda: (inputs, {})

  def loss(self, params, inputs, rng, deterministic):
    apply = lambda method, x: self.retriever.apply(
        {'params': params['retriever']}, *(x[k] for k in _KEYS),
        deterministic=deterministic, rngs={'dropout': rng}, method=method)
    return losses.ict_loss(apply('embed_query', inputs['query']),
                           apply('embed_documents', inputs['block']))


@gin.configurable
class Pretrain(_Retrieving):
  """REALM pre-training: marginal masked-LM through the retrieved candidates.

  Attributes:
    corpus_name: the knowledge corpus, also the source of the queries.
    masking: 'salient' (the paper's), 'random_uniform' or 'random_span'.
    num_candidates: k = 8 with the null document (the paper's).
    exclude_source: drop the trivial candidate (the query's own block).
    marginalize: 'per_token' (released code) or 'whole_span' (paper eq. 2).
    query_length / max_masked: 96 wordpieces / masked tokens per query.
    block_length: wordpieces read of each candidate block (None: all).
    ict_model_dir: warm-start the retriever from an ICT run's last checkpoint.
    reader_model_dir: warm-start the reader (BERT and masked-LM head) from
      another pre-training run's last checkpoint: the paper's reader starts
      from BERT with its trained MLM head, which MiniLM does not ship.
    bert_dir: BERT weights for the encoder (and the towers without ICT);
      default the embedded MiniLM, '' for none.
    microbatches: slices of the batch trained one at a time (memory).
    source_block_rate: with num_candidates = 1, the share of queries that
      read their own block (the trivial candidate REALM excludes, section
      3.4) instead of the null document: a reader warm start that learns to
      copy a span from the text it reads as well as to predict without it.
    null_score_offset: None scores the null document as the paper does, by
      the document tower's embedding of an empty block; its f(x, null) then
      sits tens of nats below the retrieved blocks (docs/RESULTS.md). A
      number d scores it max_z f(x, z) - d over the retrieved blocks (no
      gradient through the max), so that the marginal can fall back on
      reading nothing when the blocks do not help. Not the paper's.
  """

  def __init__(self, corpus_name: str = 'wiki_leads', masking: str = 'salient',
               num_candidates: int = 8, exclude_source: bool = True,
               null_document: bool = True,
               marginalize: losses.Marginalization = 'per_token',
               query_length: int = 96, max_masked: int = 20,
               block_length: int | None = None,
               ict_model_dir: str | None = None,
               reader_model_dir: str | None = None,
               bert_dir: str | None = None, microbatches: int = 1,
               source_block_rate: float = 0.0,
               null_score_offset: float | None = None):
    if source_block_rate and num_candidates != 1:
      raise ValueError(f'Pretrain.source_block_rate={source_block_rate} '
                       'needs Pretrain.num_candidates = 1 (a reader warm '
                       f'start), not {num_candidates}.')
    if null_score_offset is not None and not null_document:
      raise ValueError(f'Pretrain.null_score_offset={null_score_offset} '
                       'scores the null document: it needs '
                       'Pretrain.null_document = True.')
    self.null_score_offset = null_score_offset
    self.corpus_name, self.microbatches = corpus_name, microbatches
    self.reader_model_dir = reader_model_dir
    self.source_block_rate = source_block_rate
    self.task = f'realm_pretrain_{corpus_name}_{masking}'
    self.eval_split = 'validation'
    self.shapes = {'query_token_ids': (query_length,),
                   'mlm_positions': (max_masked,),
                   'mlm_targets': (max_masked,), 'block_id': ()}
    self.num_candidates, self.exclude_source = num_candidates, exclude_source
    self.null_document, self.marginalize = null_document, marginalize
    self.ict_model_dir, self.bert_dir = ict_model_dir, bert_dir
    self.block_length = block_length

  def setup(self, model_dir, mesh):
    super().setup(model_dir, mesh)
    self._setup_retrieval(self.corpus_name, self.num_candidates,
                          self.null_document, self.exclude_source,
                          self.block_length)

  def abstract_inputs(self, batch_size, block_length):
    masked = (batch_size, self.shapes['mlm_positions'][0])
    return {'query': _abstract_tokens(batch_size,
                                      self.shapes['query_token_ids'][0]),
            'candidates': _abstract_tokens(batch_size, self.num_candidates,
                                           self.block_length or block_length),
            'candidate_mask': _abstract((batch_size, self.num_candidates),
                                        bool),
            'mlm_positions': _abstract(masked),
            'mlm_targets': _abstract(masked), 'mlm_mask': _abstract(masked)}

  def warm_start(self, params):
    params = _bert_warm_start(params, self.bert_dir,
                              self.model.retriever_config,
                              self.model.reader_config)
    if self.ict_model_dir:
      params, self.warm_index = _ict_retriever(params, self.ict_model_dir)
    if self.reader_model_dir:
      step, restored = checkpoints.restore_params(self.reader_model_dir)
      if 'reader' not in restored:
        raise ValueError(f'Pretrain.reader_model_dir='
                         f'{self.reader_model_dir!r}: its step {step} has no '
                         'reader_params (an ICT run?).')
      params = {**params, 'reader': restored['reader']}
      print(f'reader warm-started from step {step} of '
            f'{self.reader_model_dir}', flush=True)
    return params

  def dispatch_prepare(self, examples, params, step):
    query = token_arrays(examples['query_token_ids'])
    length = query['token_ids'].shape[1]
    if np.any(examples['mlm_positions'] >= length):
      raise ValueError(f'A masked position lies past the {length}-wordpiece '
                       f'query (Pretrain.query_length) in {self.task}: its '
                       'masking made longer queries.')
    if self.source_block_rate:
      # Seeded by the step: a resumed run reads what it would have read.
      source = np.random.default_rng(step).random(len(examples['block_id']))
      ids = np.where(source < self.source_block_rate, examples['block_id'],
                     NULL_DOCUMENT_ID)[:, None]
      retrieved = lambda: (self.retrieval.blocks_of(ids),
                           np.ones(ids.shape, bool), ids)
    else:
      retrieved = self.retrieval.dispatch_candidates(
          self.query_embeddings(params, query), examples['block_id'])
    # Of the index the search above reads.
    host_metrics = {'index_staleness': self.retrieval.client.staleness(step)}

    def host_part():
      blocks, mask, _ = retrieved()
      targets = np.asarray(examples['mlm_targets'], np.int32)
      return {'query': query, 'candidates': blocks, 'candidate_mask': mask,
              'mlm_positions': np.asarray(examples['mlm_positions'], np.int32),
              'mlm_targets': targets,
              'mlm_mask': (targets != 0).astype(np.int32)}, host_metrics
    return host_part

  def _outputs(self, params, inputs, rng, deterministic):
    scores, logits = self.model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        inputs['mlm_positions'], deterministic, rngs={'dropout': rng},
        method='pretrain')
    if self.null_score_offset is not None and scores.shape[1] > 1:
      scores = losses.null_score_below_best(scores, inputs['candidate_mask'],
                                            self.null_score_offset)
    return (scores, inputs['candidate_mask'], logits, inputs['mlm_targets'],
            inputs['mlm_mask'], self.marginalize)

  def loss(self, params, inputs, rng, deterministic):
    return losses.realm_mlm_loss(*self._outputs(params, inputs, rng,
                                                deterministic))

  def per_example(self, params, inputs):
    """Held-out terms of each query (see `losses.realm_mlm_per_example`)."""
    return losses.realm_mlm_per_example(*self._outputs(
        params, inputs, jax.random.PRNGKey(0), True))

  def start(self, params, step):
    # A resumed or extended run: the index builder must keep going.
    publication.clear_training_done(self.model_dir)
    super().start(params, step)

  def finish(self):
    publication.mark_training_done(self.model_dir)


@gin.configurable
class Finetune(_Retrieving):
  """Open-QA fine-tuning (ORQA-style, as REALM fine-tunes).

  The document embeddings stay those of the index (frozen); the query tower
  and the reader train; the reader reads the top `num_candidates`.

  Attributes:
    benchmark: nq_open, web_questions or curated_trec.
    num_candidates: blocks read per question (5).
    block_length: wordpieces read of each candidate block (None: all).
    pretrain_model_dir: warm start from a pre-training run's last checkpoint
      (retriever and reader); without it, BERT weights.
    ict_model_dir: without a pre-training run, the retriever from an ICT
      run's last checkpoint and the reader from BERT: ORQA, the paper's
      baseline.
    microbatches: slices of the batch trained one at a time (memory).
  """

  def __init__(self, benchmark: str = 'nq_open', corpus_name: str = 'wiki_leads',
               num_candidates: int = 5, query_length: int = 64,
               max_answers: int = 8, max_answer_length: int = 16,
               block_length: int | None = None,
               pretrain_model_dir: str | None = None,
               ict_model_dir: str | None = None,
               bert_dir: str | None = None, microbatches: int = 1):
    if pretrain_model_dir and ict_model_dir:
      raise ValueError('Finetune starts from a pre-training run '
                       '(pretrain_model_dir) or from an ICT retriever '
                       '(ict_model_dir), not both.')
    self.task, self.corpus_name = benchmark, corpus_name
    self.ict_model_dir = ict_model_dir
    self.microbatches = microbatches
    self.eval_split = 'test'
    self.shapes = {'query_token_ids': (query_length,),
                   'answer_token_ids': (max_answers, max_answer_length)}
    self.num_candidates = num_candidates
    self.pretrain_model_dir, self.bert_dir = pretrain_model_dir, bert_dir
    self.block_length = block_length

  def setup(self, model_dir, mesh):
    super().setup(model_dir, mesh)
    self._setup_retrieval(self.corpus_name, self.num_candidates,
                          null_document_first=False, exclude_source=False,
                          block_length=self.block_length)
    # The index is built once from the starting document tower, never again.
    self.retrieval.client.follow = False
    if self.retrieval.client.searcher_kind != 'exact':
      raise ValueError(
          "Fine-tuning reads the index's document embeddings, which only the "
          "exact searcher keeps: bind IndexClient.searcher = 'exact'.")

  def abstract_inputs(self, batch_size, block_length):
    k = self.num_candidates
    answers = (batch_size, *self.shapes['answer_token_ids'])
    return {'query': _abstract_tokens(batch_size,
                                      self.shapes['query_token_ids'][0]),
            'candidates': _abstract_tokens(batch_size, k,
                                           self.block_length or block_length),
            'candidate_mask': _abstract((batch_size, k), bool),
            'candidate_embeddings': _abstract(
                (batch_size, k, self.model.projection_size), jnp.float32),
            'answer_token_ids': _abstract(answers),
            'answer_mask': _abstract(answers)}

  def warm_start(self, params):
    if not self.pretrain_model_dir:
      params = _bert_warm_start(params, self.bert_dir,
                                self.model.retriever_config,
                                self.model.reader_config)
      if self.ict_model_dir:
        params, self.warm_index = _ict_retriever(params, self.ict_model_dir)
      return params
    step, restored = checkpoints.restore_params(self.pretrain_model_dir)
    if 'reader' not in restored:
      raise ValueError(
          f'Finetune.pretrain_model_dir={self.pretrain_model_dir!r}: its step '
          f'{step} has no reader_params (an ICT run?). Point it at a REALM '
          'pre-training run, or leave it unset to start from BERT weights.')
    print(f'warm-started from pre-training step {step} of '
          f'{self.pretrain_model_dir}', flush=True)
    self.warm_index = (self.pretrain_model_dir, step)
    return restored

  def frozen(self, params):
    frozen = jax.tree.map(lambda _: False, params)
    frozen['reader']['mlm_head'] = jax.tree.map(
        lambda _: True, params['reader']['mlm_head'])
    if 'document_embedder' in params['retriever']:
      frozen['retriever']['document_embedder'] = jax.tree.map(
          lambda _: True, params['retriever']['document_embedder'])
    return frozen

  def dispatch_prepare(self, examples, params, step):
    del step  # The index stays the one fine-tuning started with.
    query = token_arrays(examples['query_token_ids'])
    retrieved = self.retrieval.dispatch_candidates(
        self.query_embeddings(params, query),
        np.full(len(query['token_ids']), -1))

    def host_part():
      blocks, mask, ids = retrieved()
      answers = np.asarray(examples['answer_token_ids'], np.int32)
      return {'query': query, 'candidates': blocks, 'candidate_mask': mask,
              'candidate_embeddings':
                  self.retrieval.client.document_embeddings(ids),
              'answer_token_ids': answers,
              'answer_mask': (answers != 0).astype(np.int32)}, {}
    return host_part

  def loss(self, params, inputs, rng, deterministic):
    scores, spans, reader_inputs = self.model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        inputs['candidate_embeddings'], deterministic, rngs={'dropout': rng},
        method='read_spans')
    width = self.model.max_span_width
    return losses.qa_loss(
        scores, inputs['candidate_mask'], spans,
        span_mask(reader_inputs['block_mask'], width),
        gold_span_mask(reader_inputs['token_ids'], reader_inputs['block_mask'],
                       inputs['answer_token_ids'], inputs['answer_mask'],
                       width))
