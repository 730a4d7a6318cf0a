"""From a host batch of examples to the step's inputs: where retrieval runs.

An input preparer turns a batch of examples (from the run's source,
`realm_jax.input`) into the arrays an objective's loss reads. For the kinds that read retrieved blocks, it embeds
the queries with the current query tower, searches the newest published
index and gathers the candidates' wordpieces from host memory (see
`retrieval`). `dispatch_prepare` splits that into the device work, queued at
once, and the host's share, which the train loop does while the device runs
the step before. A preparer also owns the run's side of the hand-over with
the index builder: the first index, and the TRAINING_DONE marker.
"""

import functools
import json

import numpy as np

from realm_jax import default_files, errors, run_directory
from realm_jax.data import corpus
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.models.candidates import NULL_DOCUMENT_ID
from realm_jax.models.realm import model_retriever
from realm_jax.training.objectives import MarginalMaskedLm, SpanQa
from realm_jax.training.retrieval import CandidateRetrieval


def token_arrays(token_ids, token_type_ids=None) -> dict:
  """token_ids/input_mask/token_type_ids of zero-padded wordpieces."""
  token_ids = np.asarray(token_ids, np.int32)
  return {'token_ids': token_ids,
          'input_mask': (token_ids != 0).astype(np.int32),
          'token_type_ids': (np.zeros_like(token_ids) if token_type_ids is None
                             else np.asarray(token_type_ids, np.int32))}


def task_tokenizer() -> WordPieceTokenizer:
  """The WordPiece tokenizer of every task's queries and blocks."""
  return _tokenizer(default_files.task_vocab())


@functools.cache
def _tokenizer(vocab_path: str) -> WordPieceTokenizer:
  return WordPieceTokenizer(vocab_path)


def task_vocabulary() -> dict:
  """The tasks' vocabulary as a run records it: its file, its size and the
  hash of its wordpieces (what their ids mean)."""
  path = default_files.task_vocab()
  return {'file': path, 'wordpieces': task_tokenizer().vocab_size,
          'sha256': corpus.vocab_hash(path)}


def check_trained_vocabulary(model_dir: str) -> dict | None:
  """Refuses a run trained with another vocabulary than the tasks' (a
  model's wordpiece ids read under other pieces answer garbage, without an
  error). Returns what the run recorded; None for a run written before it
  recorded one (or imported)."""
  path = run_directory.vocabulary_path(model_dir)
  if not path.exists():
    return None
  try:
    trained = json.loads(path.read_text())
    recorded = trained['sha256']
  except (ValueError, KeyError, TypeError) as error:
    raise errors.BadInput(f'{path}: not a vocabulary record ({error}).'
                          ) from error
  here = task_vocabulary()
  if here['sha256'] != recorded:
    raise errors.BadConfig(
        f'{model_dir} was trained with the vocabulary {trained.get("file")} '
        f'({trained.get("wordpieces")} wordpieces, sha256 {recorded[:12]}), '
        f'but this command reads {here["file"]} ({here["wordpieces"]} '
        f'wordpieces, sha256 {here["sha256"][:12]}): set '
        f'${default_files.VOCAB_ENV} to the run\'s vocabulary ({path}).')
  return trained


def record_vocabulary(model_dir: str) -> None:
  """Writes the tasks' vocabulary beside a run's config, or refuses a run
  trained with another (`check_trained_vocabulary`)."""
  if check_trained_vocabulary(model_dir) is None:
    run_directory.vocabulary_path(model_dir).write_text(
        json.dumps(task_vocabulary(), indent=2))


def corpus_retrieval(model_dir: str, mesh, retriever, tokenizer,
                     corpus_name: str, num_candidates: int,
                     null_document_first: bool = False,
                     exclude_source: bool = False,
                     block_length: int | None = None) -> CandidateRetrieval:
  """Retrieval from a named corpus and model_dir's indexes."""
  return CandidateRetrieval(
      model_dir, corpus.corpus_dir(corpus_name), retriever, mesh,
      num_candidates, null_document_first, exclude_source, tokenizer.cls_id,
      tokenizer.sep_id, block_length)


class InputPreparer:
  """Host batches -> the step's inputs (and host-side metrics)."""

  def prepare(self, examples: dict, params, step: int):
    """(the step's inputs, host metrics) from one host batch of examples,
    retrieving with `params` (after `step` updates)."""
    return self.dispatch_prepare(examples, params, step)()

  def dispatch_prepare(self, examples: dict, params, step: int):
    """`prepare` in two parts: its device work (the query embedding, an
    exact search) queued now; the returned function does the host's share
    and gives what `prepare` gives."""
    raise NotImplementedError

  def start(self, params, step: int,
            warm_index: tuple[str, int] | None = None) -> None:
    """Called once the parameters exist, before the first batch;
    `warm_index`: (model_dir, step) of the run whose parameters a fresh run
    started from (its index of that step, if published, is this run's
    first)."""

  def finish(self) -> None:
    """Called once training is done."""


class InverseClozeInputs(InputPreparer):
  """ICT: in-batch negatives, nothing retrieved."""

  def dispatch_prepare(self, examples, params, step):
    del params, step
    inputs = {'query': token_arrays(examples['query_token_ids']),
              'block': token_arrays(examples['block_token_ids'],
                                    examples['block_token_type_ids'])}
    return lambda: (inputs, {})


class _RetrievingInputs(InputPreparer):
  """Shared by the kinds that read retrieved blocks.

  `refreshed`: the index builder re-embeds this run's checkpoints beside
  it; the run swaps in each index it publishes and marks training done
  when it ends, so that the builder stops.
  """

  def __init__(self, model_dir: str, mesh, objective, task: str,
               corpus_name: str, null_document_first: bool,
               exclude_source: bool, refreshed: bool):
    self.model_dir, self.task, self.refreshed = model_dir, task, refreshed
    self.tokenizer = task_tokenizer()
    self.retrieval = corpus_retrieval(
        model_dir, mesh, model_retriever(objective.model), self.tokenizer,
        corpus_name, objective.num_candidates, null_document_first,
        exclude_source, objective.block_length)
    self.retrieval.client.follow = refreshed

  def query(self, examples) -> dict:
    return token_arrays(examples['query_token_ids'])

  def start(self, params, step, warm_index=None):
    if self.refreshed:
      # A resumed or extended run: the index builder must keep going.
      run_directory.clear_training_done(self.model_dir)
    if not self.retrieval.fetch:
      return  # The null document alone: no index to read.
    self.retrieval.ensure_index(step, params['retriever'],
                                warm_index if step == 0 else None)

  def finish(self):
    if self.refreshed:
      run_directory.mark_training_done(self.model_dir)


class MaskedLmInputs(_RetrievingInputs):
  """REALM pre-training: masked queries, the null document and the top-k.

  `source_block_rate`: see `run_kinds.Pretrain`. Where the query's own
  block is not excluded (a query that is no sentence of the corpus, whose
  `block_id` names the block holding its answer: `data.world`), the host
  metrics hold `source_block_top1`, the share of the batch whose first
  retrieved block is that one. `keep_candidate_ids` adds each query's
  candidate ids [B, k] to the inputs as 'candidate_ids' (for evaluation).
  The candidates' embeddings in the index come as 'candidate_embeddings'
  where the objective reads them (frozen towers) or `index_embeddings` is
  set (a step scored with the index its own towers embedded).
  """

  def __init__(self, model_dir: str, mesh, objective: MarginalMaskedLm,
               task: str, corpus_name: str, null_document: bool,
               exclude_source: bool, source_block_rate: float = 0.0,
               source_block: str = 'own'):
    super().__init__(model_dir, mesh, objective, task, corpus_name,
                     null_document, exclude_source, refreshed=True)
    self.source_block_rate, self.source_block = source_block_rate, source_block
    self.null_document, self.exclude_source = null_document, exclude_source
    self.keep_candidate_ids = False
    self.index_embeddings = objective.reads_index_embeddings
    if self.index_embeddings and not self.retrieval.client.keeps_embeddings:
      raise errors.BadConfig(
          'Pretrain.train_retriever = False scores the candidates by the '
          "index's document embeddings, which only the exact searcher "
          "keeps: bind IndexClient.searcher = 'exact'.")

  def dispatch_prepare(self, examples, params, step):
    query = self.query(examples)
    length = query['token_ids'].shape[1]
    if np.any(examples['mlm_positions'] >= length):
      raise ValueError(f'A masked position lies past the {length}-wordpiece '
                       f'query (Pretrain.query_length) in {self.task}: its '
                       'masking made longer queries.')
    if self.source_block_rate:
      # Seeded by the step: a resumed run reads what it would have read.
      rng = np.random.default_rng(step)
      source = rng.random(len(examples['block_id']))
      own, targets = examples['block_id'], examples['mlm_targets']
      holders = lambda fallback=None: self.retrieval.span_holders(
          own, targets, np.asarray(targets) != 0, rng, fallback)
      read = {'own': lambda: own,
              'sibling': lambda: self.retrieval.siblings(own, rng),
              'holding': holders,
              'holding_else_sibling': lambda: holders(
                  self.retrieval.siblings(own, rng)),
              }[self.source_block]()
      ids = np.where(source < self.source_block_rate, read,
                     NULL_DOCUMENT_ID)[:, None]
      retrieved = lambda: (self.retrieval.blocks_of(ids),
                           np.ones(ids.shape, bool), ids)
    else:
      retrieved = self.retrieval.dispatch_candidates(
          self.retrieval.query_embeddings(params['retriever'], query),
          examples['block_id'], step)
    # Of the index the search above reads.
    host_metrics = {'index_staleness': self.retrieval.client.staleness(step)}

    def host_part():
      blocks, mask, ids = retrieved()
      targets = np.asarray(examples['mlm_targets'], np.int32)
      first = int(self.null_document)  # The null document comes first.
      if (not self.exclude_source and not self.source_block_rate
          and ids.shape[1] > first):
        host_metrics['source_block_top1'] = float(np.mean(
            ids[:, first] == np.asarray(examples['block_id'])))
      inputs = {'query': query, 'candidates': blocks, 'candidate_mask': mask,
                'mlm_positions': np.asarray(examples['mlm_positions'],
                                            np.int32),
                'mlm_targets': targets,
                'mlm_mask': (targets != 0).astype(np.int32)}
      if self.keep_candidate_ids:
        inputs['candidate_ids'] = np.asarray(ids)
      if self.index_embeddings and ids.shape[1] > 1:
        inputs['candidate_embeddings'] = self.retrieval.candidate_embeddings(
            ids, params['retriever'])
      return inputs, host_metrics
    return host_part


def blocks_holding_answers(token_ids, searchable, answer_ids):
  """[B, n] whether block (b, j)'s searchable wordpieces hold one of example
  b's answers: token_ids / searchable [B, n, L], answer_ids [B, A, W]
  zero-padded. The gold-span rule of `reader.gold_span_mask`, on the host,
  for blocks that are scored but not read (ORQA's retriever beam)."""
  token_ids = np.asarray(token_ids)
  held = np.zeros(token_ids.shape[:2], bool)
  length = token_ids.shape[2]
  for b, answers in enumerate(np.asarray(answer_ids)):
    for answer in answers:
      answer = answer[answer != 0]
      width = len(answer)
      if not 0 < width <= length:
        continue
      # Where the first wordpiece matches, then each next one.
      j, start = np.nonzero((token_ids[b, :, :length - width + 1] == answer[0])
                            & searchable[b, :, :length - width + 1])
      for offset in range(1, width):
        keep = (token_ids[b, j, start + offset] == answer[offset]) & (
            searchable[b, j, start + offset])
        j, start = j[keep], start[keep]
      held[b, j] = True
  return held


class OpenQaInputs(_RetrievingInputs):
  """Open-QA: questions and their top-k blocks. With the document tower
  frozen (the paper), from the index fine-tuning started with, never
  refreshed, and those blocks' embeddings from that index; with a retriever
  beam (ORQA's top n >= k), the n blocks' embeddings and which of them hold
  an answer. With it trained (`SpanQa.train_document_tower`), from the
  newest index the builder published, as in pre-training."""

  def __init__(self, model_dir: str, mesh, objective: SpanQa, task: str,
               corpus_name: str):
    super().__init__(model_dir, mesh, objective, task, corpus_name,
                     null_document_first=False, exclude_source=False,
                     refreshed=objective.train_document_tower)
    self.objective = objective
    if not self.retrieval.client.keeps_embeddings:
      raise errors.BadConfig(
          "Fine-tuning reads the index's document embeddings, which only the "
          "exact searcher keeps: bind IndexClient.searcher = 'exact'.")

  def dispatch_prepare(self, examples, params, step):
    query = self.query(examples)
    client, retrieved = self.retrieval.client, self.objective.retrieved
    client.refresh_for(step)
    searched = client.dispatch(
        self.retrieval.query_embeddings(params['retriever'], query),
        min(retrieved, self.retrieval.blocks['token_ids'].shape[0]))
    # Of the index the search above reads.
    host_metrics = ({'index_staleness': client.staleness(step)}
                    if self.refreshed else {})

    def host_part():
      _, ids = searched()
      # A corpus smaller than the beam: the rest is padding.
      ids = np.pad(ids, ((0, 0), (0, retrieved - ids.shape[1])),
                   constant_values=NULL_DOCUMENT_ID)
      read = ids[:, :self.objective.num_candidates]
      answers = np.asarray(examples['answer_token_ids'], np.int32)
      inputs = {'query': query, 'candidates': self.retrieval.blocks_of(read),
                'candidate_mask': read >= 0,
                'answer_token_ids': answers,
                'answer_mask': (answers != 0).astype(np.int32)}
      if not self.objective.train_document_tower:
        inputs['candidate_embeddings'] = client.document_embeddings(ids)
      if self.objective.retriever_beam_size:
        blocks = self.retrieval.blocks
        rows = np.maximum(ids, 0)
        searchable = (blocks['input_mask'][rows] if
                      self.objective.model.include_title else
                      blocks['token_type_ids'][rows] == 1)
        inputs['beam_mask'] = ids >= 0
        inputs['beam_has_answer'] = inputs['beam_mask'] & (
            blocks_holding_answers(blocks['token_ids'][rows],
                                   searchable.astype(bool), answers))
      return inputs, host_metrics
    return host_part
