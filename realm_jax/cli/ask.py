"""`realm-jax ask`: a question answered by a fine-tuning run."""

from realm_jax.cli import common

COMMAND = 'ask'


def add_parser(command, flags) -> None:
  del flags
  ask = command(
      'ask', help='Answer a question with a fine-tuning run, showing the '
      'blocks it read and how each one supports the answer.')
  common.one_or_many_arguments(
      ask, ('question', 'e.g. "who wrote the origin of species?"'),
      ('--questions', 'questions', 'answered'),
      'A `realm-jax train` fine-tuning run.', 'question', 'the answer, its '
      'probability, the runners-up and each block with p(z|x) and p(y|z,x)')


def run(args) -> None:
  from realm_jax.evaluation.prediction import QAPredictor  # pylint: disable=g-import-not-at-top
  with common.one_or_many('ask', args.question, args.questions, args.output) as (
      questions, _, write):
    # It reads its candidates, whatever top_k.
    predictor = QAPredictor(args.model_dir, top_k=1, answers_only=True)
    for n, (_, question) in enumerate(questions):
      result = predictor.ask(question)
      if n:
        print()
      print(f'Q: {result["question"]}')
      label = 'p(z,s|x)' if result['answer_rule'] == 'best_span' else 'p(y|x)'
      print(f'A: {result["answer"]}   {label} = {result["p_answer"]:.3f}   '
            f'(step {result["step"]}, index step {result["index_step"]})')
      if result['alternatives']:
        print('   else: ' + '  '.join(f'{t} {p:.3f}'
                                      for t, p in result['alternatives']))
      print(f'{"p(z|x)":>7} {"p(y|z,x)":>9}  block')
      for block in result['blocks']:
        print(f'{block["p_z"]:7.3f} {block["p_y_given_z"]:9.3f}  '
              f'{block["title"]}: {block["text"]}')
      write(result)
