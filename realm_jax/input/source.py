"""Where a run's examples come from: the one interface every reader of
examples uses, whichever source stands behind it.

A source is chosen once, where a run is loaded (`realm_jax.input.configured`,
from gin's `Examples.source`), and handed to whatever reads the run's
examples: the trainer, held-out scoring, Open-QA evaluation. Two sources
stand behind it today, the seqio tasks (`seqio_source`, the TensorFlow
extra) and pre-exported arrays (`arrays`, the TF-free core, where pre-training
queries are drawn on the fly from salient spans).

Either way a run resumed after b batches reads from batch b on, so resumes
are exact.
"""

import abc
import dataclasses
from typing import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class Questions:
  """An Open-QA task's test questions with their texts.

  Attributes:
    examples: {'question': str, 'answers': [str]} per question, in order.
    query_token_ids: [len(examples), query_length] their wordpieces.
    regex: the answers are patterns, scored by regex match.
  """
  examples: list[dict]
  query_token_ids: np.ndarray
  regex: bool


class Source(abc.ABC):
  """Fixed-shape numpy batches of a task, in an order the seed decides."""

  kind: str

  @abc.abstractmethod
  def batches(self, task: str, split: str, shapes: dict[str, tuple[int, ...]],
              batch_size: int, seed: int = 0, shuffle: bool = True,
              num_epochs: int | None = None, skip_batches: int = 0,
              data_shards: int | None = None, drop_remainder: bool = True
              ) -> Iterator[dict[str, np.ndarray]]:
    """This process's rows of each global batch of `batch_size` examples.

    Args:
      task: a task's name.
      split: e.g. 'train' or 'validation'.
      shapes: feature -> fixed per-example shape; other features are dropped.
      batch_size: the global batch; divided over the processes.
      seed: shuffle and preprocessing seed (masking, ICT's sentence choice).
      shuffle: False for evaluation.
      num_epochs: None repeats forever.
      skip_batches: global batches already consumed (resume).
      data_shards: (seqio) disjoint shards of the data (default: one per
        process); a multiple of the process count that divides
        `batch_size`.
      drop_remainder: False keeps a short last batch (scoring every
        held-out example).
    """

  @abc.abstractmethod
  def example_count(self, task: str, split: str, shapes: dict) -> int | None:
    """How many examples a split has, where that is known without reading
    it; None where it is not."""

  @abc.abstractmethod
  def position(self, task: str, data_shards: int) -> dict:
    """What, besides the task, seed and batch size, decides which examples
    a training run reads in which order: a checkpoint records it, and a
    resume under another one is refused."""

  @abc.abstractmethod
  def questions(self, task: str, query_length: int,
                limit: int | None = None) -> Questions:
    """The first `limit` (None: every) questions of an Open-QA task's test
    split."""

  def add_qa_file(self, path: str, regex: bool) -> None:
    """Makes an Open-QA file readable under its task name
    (`data.open_qa.qa_file_task_name`). Arrays were exported under that
    name already."""
    del path, regex
