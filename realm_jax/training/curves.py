"""Training curves: the metrics JSONL drawn as a PNG beside it.

One panel per metric (train and held-out eval/ on the same axes), so a run's
loss, masked accuracy, retrieval_utility and index staleness read at a glance.
"""

import json

from etils import epath

CURVES = ('loss', 'masked_token_accuracy', 'retrieval_utility',
          'null_document_prob', 'index_staleness', 'accuracy',
          'answer_recall', 'learning_rate')


def read_metrics(jsonl_path: str) -> dict[str, tuple[list[int], list[float]]]:
  """name -> (steps, values); a step written twice (a resumed run) keeps its
  last value."""
  by_name: dict[str, dict[int, float]] = {}
  with epath.Path(jsonl_path).open() as f:
    for number, line in enumerate(f, 1):
      try:
        row = json.loads(line)
      except json.JSONDecodeError as error:
        raise ValueError(f'{jsonl_path}:{number}: not JSON ({error}).') from None
      step = row.pop('step')
      for name, value in row.items():
        by_name.setdefault(name, {})[step] = value
  return {name: (sorted(values), [values[s] for s in sorted(values)])
          for name, values in by_name.items()}


def plot_curves(jsonl_path: str, png_path: str, names=CURVES) -> list[str]:
  """Draws every metric of `names` the file has (train and eval/); returns
  the names drawn."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  metrics = read_metrics(jsonl_path)
  drawn = [n for n in names if n in metrics or f'eval/{n}' in metrics]
  if not drawn:
    raise ValueError(f'{jsonl_path} has none of the metrics {list(names)}.')
  columns = min(3, len(drawn))
  rows = -(-len(drawn) // columns)
  figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3 * rows),
                              squeeze=False)
  for axis, name in zip(axes.flat, drawn):
    for label, key in (('train', name), ('held-out', f'eval/{name}')):
      if key in metrics:
        steps, values = metrics[key]
        axis.plot(steps, values, marker='o' if len(steps) < 20 else None,
                  label=label)
    axis.set_title(name)
    axis.set_xlabel('step')
    axis.legend(fontsize='small')
  for axis in list(axes.flat)[len(drawn):]:
    axis.axis('off')
  figure.tight_layout()
  with epath.Path(png_path).open('wb') as f:
    figure.savefig(f, format='png', dpi=100)
  plt.close(figure)
  return drawn
