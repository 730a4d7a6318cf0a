"""seqio tasks of realm-jax, registered at import.

- realm_pretrain_<corpus>_<masking>: masked-LM queries (salient spans, or the
  random_uniform / random_span ablations) from an annotated corpus.
- ict_<corpus>: Inverse Cloze Task pairs from a corpus.
- nq_open, web_questions, curated_trec: Open-QA train and test splits.
- qa_file_<stem>_<content hash>: any Open-QA file, registered when asked
  (`open_qa.register_qa_file`): `realm-jax eval --qa_file`,
  `Finetune.qa_file`.

Corpora are found under $REALM_CORPUS_DIR (default runs/corpora), the
benchmarks under $REALM_DATA_DIR.
"""

from tasks import ict, open_qa, pretraining  # pylint: disable=unused-import
