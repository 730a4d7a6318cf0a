"""`realm-jax eval`: a run scored on Open-QA test sets or held-out masked
spans."""

import os

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'eval'


def add_parser(command, flags) -> None:
  del flags
  evaluate = command(
      'eval', help='Score a run on an Open-QA test set (a benchmark\'s, or '
      'any file of questions), read from the run\'s source of examples: '
      'exact match (regex match for CuratedTREC) of a fine-tuning run, and the top-1/5/20/100 '
      'retrieval accuracy of any run (DPR\'s has_answer).')
  evaluate.add_argument('--model_dir', required=True,
                        help='A `realm-jax train` run (ICT, pre-training or '
                        'fine-tuning).')
  evaluate.add_argument('--task', action='append', default=[],
                        choices=('nq_open', 'web_questions', 'curated_trec',
                                 'masked_lm'),
                        help='Repeatable. masked_lm: held-out masked '
                        'salient-span accuracy of a pre-training run.')
  evaluate.add_argument('--qa_file', action='append', default=[],
                        help='Repeatable. Any Open-QA file, every question '
                        "scored: topics TSV (question<TAB>['answer', ...]) "
                        'or JSONL ({"question": ..., "answer": [...]}), '
                        'told by its first row, else by its extension '
                        '(.tsv, .jsonl). Its files are named by its task, '
                        'qa_file_<stem>_<hash of the content>.')
  evaluate.add_argument('--qa_regex', action='store_true',
                        help='The answers of the --qa_file(s) are regular '
                        'expressions, scored by regex match as CuratedTREC '
                        "is (the task's name gets _regex).")
  evaluate.add_argument('--output_dir', default=None,
                        help='Default: model_dir/eval.')
  evaluate.add_argument('--top_k', type=int, default=100,
                        help='Blocks retrieved per question (at most every '
                        'block); top-k accuracy is reported for k = 1, 5, '
                        '20 and 100 up to it.')
  evaluate.add_argument('--retrieval_output', default=None, metavar='FILE',
                        help="Also write the retrievals (each question's "
                        'top_k blocks with id, title, text, score and '
                        'has_answer) as the JSON that DPR\'s retriever '
                        'writes, for its and Pyserini\'s scorers '
                        '(--retrieval_format); one task.')
  evaluate.add_argument('--retrieval_format', default='dpr',
                        choices=('dpr', 'pyserini', 'trec'),
                        help="--retrieval_output's layout: DPR's list with "
                        "'ctxs'; the question-keyed object with 'contexts' "
                        "that Pyserini's evaluate_dpr_retrieval reads; or a "
                        'TREC run, `qid Q0 docid rank score tag` lines '
                        "(qid the question's number, docid the block id) "
                        "that trec_eval and Pyserini's trec_eval read.")
  evaluate.add_argument('--step', type=int, default=None,
                        help='Checkpoint to score (default: the newest).')
  evaluate.add_argument('--batch_size', type=common.positive(int),
                        default=32)
  evaluate.add_argument('--num_examples', type=common.positive(int),
                        default=None,
                        help='Only the first N questions (quick looks).')
  common.add_gin(evaluate, "the run's model_dir/config.gin alone; files given here "
          'are layered over it')


def run(args) -> None:
  from realm_jax.data import open_qa  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  if not args.task and not args.qa_file:
    raise errors.BadConfig('Nothing to score.', 'Give a --task or a '
                           '--qa_file.')
  if args.qa_regex and not args.qa_file:
    raise errors.BadConfig('--qa_regex is about the answers of a --qa_file; '
                           'give one.')
  # Before the model loads: a file of no known format is refused.
  for path in args.qa_file:
    open_qa.qa_file_format(path)
  gin_files = args.gin_file or ()
  output_dir = args.output_dir or os.path.join(args.model_dir, 'eval')
  tasks = [t for t in args.task if t != 'masked_lm']
  if args.retrieval_output and len(tasks) + len(args.qa_file) != 1:
    raise errors.BadConfig('--retrieval_output is one file; give one QA '
                           f'task, not {len(tasks) + len(args.qa_file)}.')
  common.check_top_k(args.top_k)
  if args.retrieval_output:
    common.check_output(args.retrieval_output, '--retrieval_output')
  made = None
  if args.output_dir:  # Made now: one that cannot be is refused up front.
    made = _first_missing(epath.Path(args.output_dir))
    try:
      epath.Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
      raise errors.BadInput(f'Cannot make --output_dir {args.output_dir}: '
                            f'{error.strerror or error}.') from error
  try:
    _score(args, tasks, output_dir, gin_files)
  except BaseException:
    # What this command made and wrote nothing into goes with it.
    if made is not None and not any(files for _, _, files in made.walk()):
      made.rmtree(missing_ok=True)
    raise


def _first_missing(path):
  """The outermost directory of `path` that does not exist yet (None: it
  all does)."""
  missing = None
  while not path.exists():
    missing, path = path, path.parent
  return missing


def _score(args, tasks, output_dir, gin_files) -> None:
  from realm_jax.evaluation import masked_lm, qa_evaluation  # pylint: disable=g-import-not-at-top
  if 'masked_lm' in args.task:
    summary = masked_lm.evaluate(args.model_dir, output_dir, 'masked_lm',
                                 gin_files, args.gin_bindings, args.batch_size,
                                 step=args.step)
    print('masked_lm: ' + ', '.join(f'{k} {v}' for k, v in summary.items()))
  predictor = (tasks or args.qa_file) and qa_evaluation.QAPredictor(
      args.model_dir, args.step, gin_files, args.gin_bindings, args.top_k)
  tasks += [qa_evaluation.QAFile(path, args.qa_regex)
            for path in args.qa_file]
  for task in tasks:
    summary = qa_evaluation.evaluate(
        predictor, task, output_dir, args.batch_size, args.num_examples,
        args.retrieval_output, args.retrieval_format)
    print(f'{summary["task"]} ({predictor.kind} step {predictor.step}, '
          f'index step {summary["index_step"]}): ' + ', '.join(
              f'{k} {v:.2f}' if isinstance(v, float) else f'{k} {v}'
              for k, v in summary.items() if k not in (
                  'task', 'model_dir', 'run_kind', 'step', 'index_step')))
  print(f'predictions and metrics in {output_dir}')
