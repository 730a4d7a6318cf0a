"""Embedding the corpus: block arrays, batching and sharding change nothing."""

import os

import jax
import numpy as np
import pytest

from realm_jax.data import corpus
from realm_jax.data.open_corpus import OpenCorpus
from realm_jax.index.embed import DocumentEmbedder, local_block_arrays
from realm_jax.models.retriever import Retriever, init_retriever_params

pytestmark = pytest.mark.integration


def test_block_arrays_are_the_document_tower_inputs(small_corpus, tokenizer):
  directory = os.path.join(small_corpus, 'wiki_leads')
  arrays = OpenCorpus(directory).padded()
  blocks = list(corpus.read_blocks(directory).as_numpy_iterator())
  assert len(arrays['token_ids']) == len(blocks)
  for row in (0, 7, len(blocks) - 1):
    block = blocks[row]
    expected = tokenizer.numpy_join([block['title'].decode()],
                                    [block['body'].decode()], max_length=288)
    for key in ('token_ids', 'token_type_ids', 'input_mask'):
      np.testing.assert_array_equal(arrays[key][row], expected[key][0])
  # One process: its share is every block.
  np.testing.assert_array_equal(local_block_arrays(OpenCorpus(directory))['token_ids'],
                                arrays['token_ids'])


def test_a_builder_s_blocks_read_the_corpus_metadata_once(small_corpus,
                                                          monkeypatch):
  """Opened once and passed down: the share of the blocks, the store and a
  sync's new blocks do not read metadata.json again."""
  directory = os.path.join(small_corpus, 'wiki_leads')
  reads, load = [], corpus.load_metadata
  monkeypatch.setattr(corpus, 'load_metadata',
                      lambda path: reads.append(path) or load(path))
  opened = OpenCorpus(directory)
  local_block_arrays(opened)
  opened.padded(16, 3, 9)
  opened.store()
  assert reads == [directory]


def test_embeddings_do_not_depend_on_batching_or_devices(small_corpus,
                                                         tiny_config):
  arrays = OpenCorpus(os.path.join(small_corpus, 'wiki_leads')).padded(
      24, stop=20)
  arrays['token_ids'] %= tiny_config.vocab_size  # The tiny test vocab.
  retriever = Retriever(tiny_config, projection_size=16)
  params = init_retriever_params(retriever, jax.random.key(0))
  direct = np.asarray(retriever.apply(
      {'params': params}, arrays['token_ids'], arrays['input_mask'],
      arrays['token_type_ids'], method='embed_documents'))
  one = DocumentEmbedder(retriever, 8, devices=jax.devices()[:1])(params,
                                                                  arrays)
  eight = DocumentEmbedder(retriever, 8, devices=jax.devices()[:8])(params,
                                                                    arrays)
  np.testing.assert_allclose(one, direct, atol=1e-4)
  np.testing.assert_allclose(eight, direct, atol=1e-4)
