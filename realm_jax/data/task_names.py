"""The names of the tasks, which the seqio registry (`tasks/`) and the
exported arrays (`example_arrays`) both answer to."""

# How pre-training queries are masked: the paper's salient spans, and its
# ablations.
MASKINGS = ('salient', 'random_uniform', 'random_span')
# The held-out queries: every salient span once.
EVERY_SPAN = 'every_salient_span'
_PRETRAIN = 'realm_pretrain_'


def ict(corpus: str) -> str:
  return f'ict_{corpus}'


def pretrain(corpus: str, masking: str) -> str:
  return f'{_PRETRAIN}{corpus}_{masking}'


def held_out(corpus: str) -> str:
  """Every held-out salient span of the corpus, each masked once."""
  return pretrain(corpus, EVERY_SPAN)


def masked_lm(task: str) -> tuple[str, str] | None:
  """(corpus, masking) of a pre-training task's name (EVERY_SPAN the
  held-out task's); None for another task."""
  for masking in (*MASKINGS, EVERY_SPAN):
    suffix = f'_{masking}'
    if (task.startswith(_PRETRAIN) and task.endswith(suffix)
        and len(task) > len(_PRETRAIN) + len(suffix)):
      return task[len(_PRETRAIN):-len(suffix)], masking
  return None
