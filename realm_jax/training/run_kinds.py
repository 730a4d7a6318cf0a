"""The three things the one train loop trains: ICT, REALM pre-training, Open-QA.

A run kind is the gin-configured description of a run: which seqio task
feeds it and at which shapes, its objective (`objectives`: the modules and
the loss), the input preparer that feeds the objective (`step_inputs`: where
retrieval runs), and how its parameters start (`warm_start`). Parameters are
always {'retriever': ..., 'reader': ...} (ICT has no reader), so every
checkpoint's `retriever_params` item is what the index builder and the next
run's warm start read.
"""

from typing import NamedTuple

import gin

from realm_jax import errors
from realm_jax.data import open_qa, task_names
from realm_jax.models import losses
from realm_jax.models.reader import check_answer_rule
from realm_jax.models.realm import build_realm, model_retriever
from realm_jax.training import objectives, step_inputs, warm_start
from realm_jax.training.warm_start import WarmStart


class ExampleSplit(NamedTuple):
  """One split a run (or its evaluation) reads, as the seqio source's
  `export` writes it: `corpus_name` for examples made from a corpus, `strings` for
  the text features kept beside the wordpieces, `metadata` for what the
  task's metric needs to know."""
  task: str
  split: str
  shapes: dict
  corpus_name: str | None = None
  strings: tuple[str, ...] = ()
  metadata: dict = {}


class RunKind:
  """What differs between ICT, pre-training and fine-tuning.

  Attributes:
    task / eval_split: the seqio task and its held-out split.
    shapes: the task's feature shapes.
    corpus_name: the knowledge corpus (ICT: the source of its blocks).
    block_length: wordpieces read of each block (None: all).
    objective: the modules and the loss.
  """

  def __init__(self, task: str, eval_split: str, shapes: dict,
               corpus_name: str, block_length: int | None,
               objective: objectives.Objective):
    self.task, self.eval_split, self.shapes = task, eval_split, shapes
    self.corpus_name, self.block_length = corpus_name, block_length
    self.objective = objective

  def warm_start(self, params) -> WarmStart:
    """Fresh parameters -> where this run starts."""
    return WarmStart(params)

  def example_splits(self) -> list[ExampleSplit]:
    """Every split the run and its evaluation read."""
    return [ExampleSplit(self.task, split, self.shapes, self.corpus_name)
            for split in ('train', self.eval_split)]

  def retriever(self):
    """The towers' module; its parameters are the run's 'retriever'."""
    return model_retriever(self.objective.model)

  def input_preparer(self, model_dir: str, mesh) -> step_inputs.InputPreparer:
    """The preparer of this run's batches, reading model_dir's indexes."""
    raise NotImplementedError


@gin.configurable
def retriever_signal(name: losses.RetrieverSignal = 'marginal',
                     temperature: float = 0.01):
  """What trains the retriever, in pre-training and fine-tuning alike:
  one binding, `retriever_signal.name`, chooses it for every stage.

  Args:
    name: 'marginal' (REALM's marginal likelihood: the paper), 'emdr2'
      (EMDR2) or 'pdist' (Atlas's perplexity distillation); see
      `losses.realm_mlm_loss` and `losses.qa_loss`.
    temperature: pdist's temperature of the reader's distribution over the
      candidates (Atlas's temperature_gold, 0.01).

  Returns:
    (name, temperature).
  """
  try:
    return losses.check_signal(name, temperature), temperature
  except ValueError as e:
    raise errors.BadConfig(str(e)) from None


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
    super().__init__(
        task_names.ict(corpus_name), 'validation',
        {'query_token_ids': (query_length,),
         'block_token_ids': (block_length,),
         'block_token_type_ids': (block_length,)},
        corpus_name, block_length,
        objectives.InverseCloze(model_retriever(), query_length,
                                block_length))
    self.bert_dir = bert_dir

  def warm_start(self, params):
    return WarmStart(warm_start.bert(params, self.bert_dir,
                                     self.objective.retriever.config))

  def retriever(self):
    return self.objective.retriever

  def input_preparer(self, model_dir, mesh):
    del model_dir, mesh  # Nothing is retrieved.
    return step_inputs.InverseClozeInputs()


# The blocks a reader's warm start may read (Pretrain.source_block).
SOURCE_BLOCKS = ('own', 'sibling', 'holding', 'holding_else_sibling')


@gin.configurable
class Pretrain(RunKind):
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
    source_block: which block those queries read: 'own', or 'sibling'
      (another block of the query's article, at random; the null document
      where the article is one block): what REALM may retrieve, since it
      excludes the own block alone, so the reader learns to copy a span
      where the article's other text holds it, and to leave it where not;
      or 'holding' (a block of the article that holds the span verbatim,
      the query's own where no other does), so that copying pays in every
      example; or 'holding_else_sibling' (such a block where the article
      has one, else a 'sibling' block): copying pays where a block REALM
      may retrieve holds the span, and only there.
    null_score_offset: None scores the null document as the paper does, by
      the document tower's embedding of an empty block; its f(x, null) then
      sits tens of nats below the retrieved blocks (docs/levers.md). A
      number d scores it max_z f(x, z) - d over the retrieved blocks (no
      gradient through the max), so that the marginal can fall back on
      reading nothing when the blocks do not help. Not the paper's.
    train_retriever: False keeps both towers at their start, and computes
      no gradient for them: the control of a REALM run (the same run with
      its retriever frozen). Its candidates are scored by their rows of
      the index those towers embedded (the exact searcher keeps them), so
      the document tower does not run. `bert_adamw.retriever_frozen_steps`
      holds them for a while instead, their gradient computed and dropped.
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
               source_block_rate: float = 0.0, source_block: str = 'own',
               null_score_offset: float | None = None,
               train_retriever: bool = True):
    if source_block not in SOURCE_BLOCKS:
      raise errors.BadConfig(f'Pretrain.source_block={source_block!r}; '
                             f'expected one of {SOURCE_BLOCKS}.')
    if source_block_rate and num_candidates != 1:
      raise errors.BadConfig(f'Pretrain.source_block_rate={source_block_rate} '
                             'needs Pretrain.num_candidates = 1 (a reader warm '
                             f'start), not {num_candidates}.')
    if null_score_offset is not None and not null_document:
      raise errors.BadConfig(f'Pretrain.null_score_offset={null_score_offset} '
                             'scores the null document: it needs '
                             'Pretrain.null_document = True.')
    super().__init__(
        task_names.pretrain(corpus_name, masking), 'validation',
        {'query_token_ids': (query_length,), 'mlm_positions': (max_masked,),
         'mlm_targets': (max_masked,), 'block_id': ()},
        corpus_name, block_length,
        objectives.MarginalMaskedLm(
            build_realm(), query_length, max_masked, num_candidates,
            block_length, marginalize, null_score_offset, microbatches,
            train_retriever, *retriever_signal()))
    self.null_document, self.exclude_source = null_document, exclude_source
    self.source_block_rate, self.source_block = source_block_rate, source_block
    self.ict_model_dir, self.reader_model_dir = ict_model_dir, reader_model_dir
    self.bert_dir = bert_dir

  def warm_start(self, params):
    model = self.objective.model
    started = WarmStart(warm_start.bert(params, self.bert_dir,
                                        model.retriever_config,
                                        model.reader_config))
    if self.ict_model_dir:
      started = warm_start.ict_retriever(started.params, self.ict_model_dir)
    if self.reader_model_dir:
      started = started._replace(params=warm_start.reader(
          started.params, self.reader_model_dir))
    return started

  def example_splits(self):
    # And the held-out queries `realm-jax eval --task=masked_lm` scores.
    return super().example_splits() + [ExampleSplit(
        task_names.held_out(self.corpus_name), 'validation', self.shapes,
        self.corpus_name)]

  def input_preparer(self, model_dir, mesh):
    return step_inputs.MaskedLmInputs(
        model_dir, mesh, self.objective, self.task, self.corpus_name,
        self.null_document, self.exclude_source, self.source_block_rate,
        self.source_block)


@gin.configurable
class Finetune(RunKind):
  """Open-QA fine-tuning (ORQA-style, as REALM fine-tunes).

  By default the document embeddings stay those of the index (frozen); the
  query tower and the reader train; the reader reads the top
  `num_candidates`.

  Attributes:
    benchmark: nq_open, web_questions or curated_trec.
    qa_file: instead of `benchmark`, any Open-QA file (topics TSV or JSONL:
      `open_qa.load_file`), registered as a seqio task. A file brings no
      test set of its own, and a held-out loss over questions the run
      trains on would measure nothing, so a fixed 5% of its questions (by a
      hash of their text: `open_qa.held_out`) is held out of training as
      the split the trainer evaluates; score a test file of your own with
      `realm-jax eval --qa_file`. `eval` and `ask` rebuild the run, so they
      read the file at the path bound here.
    qa_regex: the answers of `qa_file` are regular expressions (scored by
      regex match, as CuratedTREC's; training reads their wordpieces as
      it reads CuratedTREC's).
    num_candidates: blocks read per question (5).
    block_length: wordpieces read of each candidate block (None: all).
    pretrain_model_dir: warm start from a pre-training run's last checkpoint
      (retriever and reader); without it, BERT weights.
    ict_model_dir: without a pre-training run, the retriever from an ICT
      run's last checkpoint and the reader from BERT: ORQA, the paper's
      baseline.
    microbatches: slices of the batch trained one at a time (memory).
    retriever_beam_size: None, or ORQA's n (5,000): the retriever's loss
      marginalizes over the top n blocks that hold an answer, not over the
      k read (see `objectives.SpanQa`).
    answer_rule: how `eval`, `ask` and the t5x adapter pick the answer:
      'marginal' (REALM section 3.2's p(y|x)) or 'best_span' (ORQA's
      argmax of f(x, z) + S(z, s), as the released models were scored);
      see `evaluation.answers`.
    train_document_tower: also train the document tower, end to end (EMDR2,
      Atlas; the paper keeps it frozen): the candidates are embedded afresh
      in the step, and the run reads each index the index builder
      (`realm-jax refresh`, or `realm_jax.launch_local`) publishes beside it, as
      pre-training does. Save checkpoints at least as often as the builder
      should refresh.
  """

  def __init__(self, benchmark: str = 'nq_open', corpus_name: str = 'wiki_leads',
               num_candidates: int = 5, query_length: int = 64,
               max_answers: int = 8, max_answer_length: int = 16,
               block_length: int | None = None,
               pretrain_model_dir: str | None = None,
               ict_model_dir: str | None = None,
               bert_dir: str | None = None, microbatches: int = 1,
               answer_rule: str = 'marginal',
               retriever_beam_size: int | None = None,
               qa_file: str | None = None, qa_regex: bool = False,
               train_document_tower: bool = False):
    if retriever_beam_size is not None and not (
        retriever_beam_size >= num_candidates):
      raise errors.BadConfig(
          f'Finetune.retriever_beam_size={retriever_beam_size}: the beam '
          'holds the blocks read, expected >= '
          f'Finetune.num_candidates={num_candidates}.')
    if pretrain_model_dir and ict_model_dir:
      raise errors.BadConfig('Finetune starts from a pre-training run '
                             '(pretrain_model_dir) or from an ICT retriever '
                             '(ict_model_dir), not both.')
    if qa_regex and not qa_file:
      raise errors.BadConfig('Finetune.qa_regex says how the answers of '
                             'Finetune.qa_file match: bind a qa_file too.')
    signal = retriever_signal()
    if retriever_beam_size is not None and signal[0] != 'marginal':
      raise errors.BadConfig(
          f'retriever_signal.name={signal[0]!r} trains the retriever from '
          'the reader\'s likelihood of each block it reads; '
          f'Finetune.retriever_beam_size={retriever_beam_size} scores '
          'blocks it does not read. Bind one of the two.')
    task, eval_split = benchmark, 'test'
    self.regex = qa_regex if qa_file else benchmark in open_qa.REGEX_ANSWERS
    self.qa_file = qa_file
    if qa_file:
      task = open_qa.qa_file_task_name(qa_file, qa_regex)
      eval_split = 'validation'
    super().__init__(
        task, eval_split,
        {'query_token_ids': (query_length,),
         'answer_token_ids': (max_answers, max_answer_length)},
        corpus_name, block_length,
        objectives.SpanQa(build_realm(), query_length, max_answers,
                          max_answer_length, num_candidates, block_length,
                          microbatches, retriever_beam_size,
                          train_document_tower, *signal))
    self.pretrain_model_dir, self.ict_model_dir = (pretrain_model_dir,
                                                   ict_model_dir)
    self.bert_dir = bert_dir
    self.answer_rule = check_answer_rule(answer_rule)

  def warm_start(self, params):
    if self.pretrain_model_dir:
      return warm_start.pretrained_realm(self.pretrain_model_dir)
    model = self.objective.model
    params = warm_start.bert(params, self.bert_dir, model.retriever_config,
                             model.reader_config)
    if self.ict_model_dir:
      return warm_start.ict_retriever(params, self.ict_model_dir)
    return WarmStart(params)

  def example_splits(self):
    # Questions, not corpus blocks; the test split (every question of a
    # file) with its texts, which `realm-jax eval` scores.
    splits = {split: ExampleSplit(self.task, split, self.shapes)
              for split in ('train', self.eval_split)}
    splits['test'] = ExampleSplit(self.task, 'test', self.shapes,
                                  strings=('question', 'answers'),
                                  metadata={'regex': self.regex})
    return list(splits.values())

  def input_preparer(self, model_dir, mesh):
    return step_inputs.OpenQaInputs(model_dir, mesh, self.objective, self.task,
                                 self.corpus_name)

