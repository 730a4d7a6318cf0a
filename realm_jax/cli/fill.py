"""`realm-jax fill`: a sentence's [MASK]s filled by a pre-training run."""

import sys

from realm_jax import errors
from realm_jax.cli import common

COMMAND = 'fill'


def add_parser(command, flags) -> None:
  del flags
  fill = command(
      'fill', help='Fill the [MASK]s of a sentence with a pre-training run, '
      'showing the documents it retrieved and how each one votes.')
  common.one_or_many_arguments(
      fill, ('text', 'e.g. "The [MASK] is the currency of the United '
             'Kingdom."'), ('--texts', 'sentences', 'filled'),
      'A `realm-jax train` pre-training run.', 'sentence', 'the filled '
      'text, p(y|x) of each [MASK], and each document with p(z|x) and '
      'p(y|z,x)')


def run(args) -> None:
  from realm_jax.evaluation.prediction import ClozePredictor  # pylint: disable=g-import-not-at-top
  with common.one_or_many('fill', args.text, args.texts, args.output) as (
      texts, report, write):
    predictor, filled = ClozePredictor(args.model_dir), 0
    for where, text in texts:
      try:
        result = predictor.fill(text)
      except errors.BadInput as error:  # No [MASK], too many, or too long:
        if where is None:  # a line of a file is skipped and counted.
          raise
        print(f'{where}: {error}', file=sys.stderr)
        report.add('not fillable', where)
        continue
      if filled:
        print()
      filled += 1
      print(f'filled: {result["filled"]}   (index step '
            f'{result["index_step"]})')
      for j, tokens in enumerate(result['masks'], 1):
        print(f'[MASK] {j}: p(y|x) ' + '  '.join(f'{t} {p:.3f}'
                                                 for t, p in tokens))
      print(f'{"p(z|x)":>7} {"p(y|z,x)":>9}  document')
      for doc in result['documents']:
        p_y = ' '.join(f'{p:.3f}' for p in doc['p_y_given_z'])
        print(f'{doc["p_z"]:7.3f} {p_y:>9}  {doc["title"]}: {doc["text"]}')
      write({'text': text, **result})
