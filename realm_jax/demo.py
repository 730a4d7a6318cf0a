"""Retrieval on the embedded default: the Wikipedia leads, embedded by MiniLM.

What `make demo` runs until the REALM trainer lands: every lead becomes a
document `[CLS] title [SEP] body [SEP]`, embedded by the pretrained
all-MiniLM-L6-v2 encoder (mean pooled and L2-normalized, the way that model was
trained), and each question retrieves its top-k documents by exact maximum
inner product search. The embeddings are cached in `work_dir`, keyed by a
fingerprint of the corpus and settings, so a re-run only answers questions.
"""

import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax import embedded
from realm_jax.data import sources
from realm_jax.data.tokenization import WordPieceTokenizer
from realm_jax.index.embed import embed_in_length_buckets
from realm_jax.index.exact import exact_search
from realm_jax.models import bert, pretrained
from realm_jax.progress import Progress

DEFAULT_QUESTIONS = (
    'who wrote the origin of species?',
    'what is the currency of the united kingdom?',
    'when did humans first land on the moon?',
    'which planet is known as the red planet?',
)


class Encoder:
  """Mean-pooled, L2-normalized BERT embeddings from pretrained weights."""

  def __init__(self, weights_dir: str):
    self.config = pretrained.config_from_hf(
        os.path.join(weights_dir, 'config.json'))
    self.params = pretrained.load_bert_params(weights_dir, self.config)
    self.tokenizer = WordPieceTokenizer(os.path.join(weights_dir, 'vocab.txt'))
    model = bert.Bert(self.config)

    @jax.jit
    def embed(params, token_ids, input_mask, token_type_ids):
      out = model.apply({'params': params}, token_ids, input_mask,
                        token_type_ids)
      pooled = bert.mean_pool(out.sequence_output, input_mask)
      return pooled / jnp.linalg.norm(pooled, axis=-1, keepdims=True)

    self._embed = embed

  def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(self._embed(self.params, batch['token_ids'],
                                  batch['input_mask'],
                                  batch['token_type_ids']))


def embed_documents(encoder: Encoder, articles, max_length: int,
                    batch_size: int) -> np.ndarray:
  """[N, D] float32 embeddings of `[CLS] title [SEP] body [SEP]`."""
  joined = encoder.tokenizer.numpy_join(
      [a.title for a in articles], [a.text for a in articles],
      max_length=max_length)
  return embed_in_length_buckets(
      encoder, joined, batch_size, Progress('embedded', len(articles),
                                            unit='docs'))


def _fingerprint(articles, weights_dir: str, max_length: int) -> str:
  digest = hashlib.sha256(f'{weights_dir}|{max_length}'.encode())
  for article in articles:
    digest.update(article.title.encode() + b'\0' + article.text.encode() +
                  b'\0')
  return digest.hexdigest()


def cached_document_embeddings(encoder: Encoder, articles, work_dir: str,
                               weights_dir: str, max_length: int,
                               batch_size: int) -> np.ndarray:
  """Embeddings from `work_dir` when they match, else computed and saved."""
  os.makedirs(work_dir, exist_ok=True)
  path = os.path.join(work_dir, 'document_embeddings.npy')
  meta_path = path + '.json'
  fingerprint = _fingerprint(articles, weights_dir, max_length)
  if os.path.exists(meta_path) and os.path.exists(path):
    with open(meta_path) as f:
      if json.load(f).get('fingerprint') == fingerprint:
        print(f'Reusing document embeddings from {path}')
        return np.load(path)
  embeddings = embed_documents(encoder, articles, max_length, batch_size)
  # Write beside, then rename: a killed run never leaves a torn cache.
  np.save(path + '.tmp.npy', embeddings)
  os.replace(path + '.tmp.npy', path)
  with open(meta_path + '.tmp', 'w') as f:
    json.dump({'fingerprint': fingerprint, 'count': len(articles),
               'max_length': max_length}, f)
  os.replace(meta_path + '.tmp', meta_path)
  return embeddings


def run(work_dir: str, questions=DEFAULT_QUESTIONS, max_docs: int | None = None,
        max_length: int = 128, batch_size: int = 64, top_k: int = 5,
        weights_dir: str | None = None, corpus_json: str | None = None):
  """Embeds the corpus (or reuses the cache) and prints each question's top-k.

  Returns the retrieved titles, one list per question.
  """
  weights_dir = weights_dir or embedded.minilm_dir()
  corpus_json = corpus_json or embedded.wiki_leads_json()
  articles = list(sources.read_wiki_leads(corpus_json))[:max_docs]
  print(f'Corpus: {len(articles):,} Wikipedia leads from {corpus_json}')
  print(f'Encoder: {weights_dir} on {jax.devices()[0].platform}')
  encoder = Encoder(weights_dir)
  embeddings = cached_document_embeddings(encoder, articles, work_dir,
                                          weights_dir, max_length, batch_size)
  start = time.perf_counter()
  queries = encoder(encoder.tokenizer.numpy_join(list(questions),
                                                 max_length=64))
  scores, ids = exact_search(queries, embeddings, k=min(top_k, len(articles)))
  scores, ids = np.asarray(scores), np.asarray(ids)
  print(f'Answered {len(questions)} questions in '
        f'{time.perf_counter() - start:.2f}s (exact MIPS over '
        f'{len(articles):,} documents)')
  retrieved = []
  for question, row_scores, row_ids in zip(questions, scores, ids):
    print(f'\nQ: {question}')
    titles = []
    for rank, (score, i) in enumerate(zip(row_scores, row_ids), 1):
      article = articles[i]
      words = ' '.join(article.text.split()[:14])
      print(f'  {rank}. [{score:.3f}] {article.title}: {words} ...')
      titles.append(article.title)
    retrieved.append(titles)
  return retrieved
