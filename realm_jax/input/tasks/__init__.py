"""seqio tasks of realm-jax (the TensorFlow extra), registered by `register`.

- realm_pretrain_<corpus>_<masking>: masked-LM queries (salient spans, or the
  random_uniform / random_span ablations) from an annotated corpus.
- ict_<corpus>: Inverse Cloze Task pairs from a corpus.
- nq_open, web_questions, curated_trec: Open-QA train and test splits.
- qa_file_<stem>_<content hash>: any Open-QA file, registered when asked
  (`open_qa.register_qa_file`): `realm-jax eval --qa_file`,
  `Finetune.qa_file`.

Corpora are found under $REALM_CORPUS_DIR (default runs/corpora), the
benchmarks under $REALM_DATA_DIR. Importing registers nothing: the seqio
source (`realm_jax.input.seqio_source`) calls `register` before it reads,
and so may a t5x-style evaluation of its own.
"""

from realm_jax.input.tasks import common, ict, open_qa, pretraining


def register(corpora=common.CORPORA) -> None:
  """Registers the tasks of `corpora` and the Open-QA benchmarks (again: a
  no-op)."""
  for corpus in corpora:
    ict.register(corpus)
    pretraining.register(corpus)
  for benchmark in open_qa.BENCHMARKS:
    open_qa.register(benchmark)
