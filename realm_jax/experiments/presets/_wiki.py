"""The stages the Wikipedia-leads presets are made of (`demo` family), each
with its run's gin bindings: a preset file lists them in order."""

from realm_jax.experiments.preset import Dir, Stage

# The reader's warm start masks as BERT does (random tokens), not salient
# spans: the reader learns to read, not the spans REALM is scored on.
READER_MASKING = 'random_uniform'
# How many refresh intervals the stale index lags (the paper's Table 2).
STALE_FACTOR = 30
QA_TASKS = ('nq_open', 'web_questions', 'curated_trec')


def corpus(block_length: int) -> Stage:
  """The leads cut into blocks of at most `block_length` wordpieces, the
  length the setup's runs read (`Pretrain.block_length`), and annotated; or
  a bundle's corpus, checked to be cut so."""
  return Stage('corpus', 'corpus', {'block_length': block_length})


def machine() -> Stage:
  return Stage('machine', 'machine', timed=False)


def ict(steps: int, batch: int) -> Stage:
  """The Inverse Cloze Task warm start of the retriever from MiniLM."""
  return Stage('ict', 'train', {'run': 'ict', 'bindings': {
      'train.num_steps': steps, 'train.checkpoint_every': steps,
      'train.batch_size': batch,
      'bert_adamw.warmup_steps': max(steps // 10, 1),
      'bert_adamw.learning_rate': 1e-4}})


def reader(steps: int, batch: int) -> Stage:
  """BERT's masked LM on the corpus, the null document alone: the reader's
  (and the MLM head's) warm start, shared by REALM and its baseline."""
  return Stage('reader', 'train', {'run': 'pretrain', 'bindings': {
      'train.num_steps': steps, 'train.checkpoint_every': steps,
      'train.batch_size': batch, 'Pretrain.num_candidates': 1,
      'Pretrain.masking': READER_MASKING,
      # [CLS] x [SEP] and the null document's [SEP].
      'build_realm.reader_length': 50, 'train.eval_every': 0,
      'bert_adamw.warmup_steps': max(steps // 10, 1),
      'bert_adamw.learning_rate': 5e-4}})


def pretrain(name: str, steps: int, batch: int, refresh_interval: int,
             builder: bool = True, **bindings) -> Stage:
  """REALM pre-training from the ICT retriever and the warm reader, with
  the index builder beside it re-embedding the towers every
  `refresh_interval` steps (`bindings` change the run: the ablations).
  Without the `builder` the run needs no index (the baseline reads the null
  document alone)."""
  cadence = {'run_refresh.refresh_interval_steps': refresh_interval,
             **{k: v for k, v in bindings.items()
                if k.startswith('run_refresh.')}}
  own = {k: v for k, v in bindings.items() if k not in cadence}
  return Stage(f'pretrain_{name}', 'train', {
      'run': 'pretrain', 'run_dir': name, 'bindings': {
          'train.num_steps': steps, 'train.batch_size': batch,
          'train.log_every': 1,
          'Pretrain.ict_model_dir': Dir('ict'),
          'Pretrain.reader_model_dir': Dir('reader'),
          # The builder embeds the towers alone, saved every interval
          # (docs/training.md, "Checkpoints and the index builder"); whole
          # checkpoints, for resuming, ten times as far apart. A run
          # without the builder saves its last.
          **({'train.retriever_every': refresh_interval} if builder else {}),
          'train.checkpoint_every': (10 * refresh_interval if builder
                                     else steps),
          'train.eval_every': 0, 'bert_adamw.warmup_steps': steps // 10,
          'bert_adamw.learning_rate': 1e-4, **own,
          **({} if builder else cadence)},
      'builder': cadence if builder else None})


def warm_starts(block_length: int, ict_steps: int, reader_steps: int,
                batch: int) -> tuple[Stage, ...]:
  """What every Wikipedia-leads preset starts with: the corpus, the
  machine, the ICT retriever (and its NQ recall) and the warm reader."""
  return (corpus(block_length), machine(), ict(ict_steps, batch),
          recall('recall_ict', 'ict'), reader(reader_steps, batch))


def pretraining(runs: dict, steps: int, batch: int, refresh_interval: int
                ) -> tuple[Stage, ...]:
  """REALM and the runs it is compared with (`runs`: name -> their own
  bindings; the baseline reads no index, so no builder runs beside it),
  REALM's throughput, then each run's held-out masked-LM scores."""
  return (*(pretrain(name, steps, batch, refresh_interval,
                     builder=name != 'baseline', **bindings)
            for name, bindings in runs.items()),
          throughput(), *(masked_lm(name) for name in runs))


def throughput() -> Stage:
  """REALM's step time and model FLOPs utilisation."""
  return Stage('throughput', 'throughput', {'run_dir': 'realm'})


def masked_lm(name: str) -> Stage:
  """Every held-out salient span scored by run `name`."""
  return Stage(f'masked_lm_{name}', 'masked_lm', {'run_dir': name},
               result=f'masked_lm/{name}')


def recall(name: str, run_dir: str) -> Stage:
  """A retriever's zero-shot recall on NQ."""
  return Stage(name, 'recall',
               {'run_dir': run_dir, 'output': f'eval/{run_dir}'},
               needs_qa=True)


def select(run_dir: str) -> Stage:
  """A retriever's recall on the questions levers are chosen on (NQ's dev
  topics, WebQuestions' train questions), never on NQ's test questions."""
  return Stage(f'select_{run_dir}', 'select',
               {'run_dir': run_dir, 'output': f'eval/select_{run_dir}'},
               needs_qa=True)


def finetune(name: str, steps: int, warm_start: dict,
             refresh_interval: int | None = None, keep: bool = True
             ) -> Stage:
  """NQ fine-tuning; `warm_start` binds Finetune.pretrain_model_dir (REALM)
  or Finetune.ict_model_dir (ORQA). With a `refresh_interval` the document
  tower trains too, and the index builder beside the trainer re-embeds the
  towers every `refresh_interval` steps, as in pre-training."""
  cadence = ({'run_refresh.refresh_interval_steps': refresh_interval}
             if refresh_interval else None)
  return Stage(f'finetune_{name}', 'train', {
      'run': 'finetune', 'bindings': {
          'train.num_steps': steps, 'train.batch_size': 8, **warm_start,
          # `[CLS] question [SEP] block [SEP]`: questions are short.
          'build_realm.reader_length': 96, 'train.eval_every': 0,
          'train.checkpoint_every': steps,
          **({'train.retriever_every': refresh_interval,
              'Finetune.train_document_tower': True} if cadence else {}),
          'bert_adamw.warmup_steps': max(steps // 10, 1),
          'bert_adamw.learning_rate': 5e-5},
      'builder': cadence}, result=None if keep else '', needs_qa=True)


def qa(name: str, tasks=QA_TASKS) -> Stage:
  """A fine-tuning run scored on the Open-QA test sets."""
  return Stage(f'qa_{name}', 'qa', {'run_dir': f'finetune_{name}',
                                    'output': f'eval/qa_{name}',
                                    'tasks': tasks}, needs_qa=True)
