"""The names of the tasks, which the seqio registry (`tasks/`) and the
exported arrays (`example_arrays`) both answer to."""

# How pre-training queries are masked: the paper's salient spans, and its
# ablations.
MASKINGS = ('salient', 'random_uniform', 'random_span')
# The held-out queries: every salient span once.
EVERY_SPAN = 'every_salient_span'


def ict(corpus: str) -> str:
  return f'ict_{corpus}'


def pretrain(corpus: str, masking: str) -> str:
  return f'realm_pretrain_{corpus}_{masking}'


def held_out(corpus: str) -> str:
  """Every held-out salient span of the corpus, each masked once."""
  return pretrain(corpus, EVERY_SPAN)
