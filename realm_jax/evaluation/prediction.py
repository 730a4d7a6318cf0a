"""Predictions with provenance from a REALM pre-training run's model_dir.

`ClozePredictor` rebuilds the model from the run's saved gin config
(model_dir/config.gin), its newest parameters and its newest index, and fills
the [MASK]s of a sentence. It shows, as the paper's Table 3 does, the marginal
p(y|x) over the retrieved candidates (the null document included) and each
candidate's p(z|x) and p(y|z,x).
"""

import os

import gin
import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.data import corpus
from realm_jax.models import losses
from realm_jax.models.candidates import NULL_DOCUMENT_ID
from realm_jax.training import checkpoints, partitioning, run_kinds

MASK = '[MASK]'


def cloze_query(tokenizer, text: str, max_length: int):
  """`[CLS] text [SEP]` ids with each '[MASK]' as one mask token, and the mask
  positions."""
  pieces = text.split(MASK)
  if len(pieces) < 2:
    raise ValueError(f'No {MASK} in {text!r}.')
  tokens = tokenizer.tokenize(pieces).to_list()
  ids = [tokenizer.cls_id]
  positions = []
  for i, piece in enumerate(tokens):
    if i:
      positions.append(len(ids))
      ids.append(tokenizer.mask_id)
    ids.extend(piece)
  ids.append(tokenizer.sep_id)
  if len(ids) > max_length:
    raise ValueError(f'{text!r} is {len(ids)} wordpieces with [CLS] and '
                     f'[SEP]; the query holds {max_length}.')
  return ids, positions


def fill_distribution(scores, candidate_mask, mlm_logits):
  """(log p(z|x) [B, k], log p(y_j|z,x) [B, k, M, V], log p(y_j|x) [B, M, V])."""
  log_p_z = losses.candidate_log_probs(scores, candidate_mask)
  log_p_vocab = jax.nn.log_softmax(mlm_logits.astype(jnp.float32), axis=-1)
  return log_p_z, log_p_vocab, losses.marginal_token_log_probs(
      log_p_z, log_p_vocab, candidate_mask)


class ClozePredictor:
  """Fills [MASK]s with a pre-training run's newest parameters and index."""

  def __init__(self, model_dir: str):
    config = os.path.join(model_dir, 'config.gin')
    if not os.path.exists(config):
      raise FileNotFoundError(f'No {config}: is {model_dir} a realm-jax '
                              'pre-training run?')
    gin.parse_config_file(config, skip_unknown=True)
    self.run = run_kinds.Pretrain()
    # One query at a time: a one-device mesh.
    self.run.setup(model_dir, partitioning.make_mesh(
        1, 1, devices=jax.local_devices()[:1]))
    self.step, self.params = checkpoints.restore_params(model_dir)
    self.run.retrieval.client.maybe_refresh(self.step)
    self.tokenizer = self.run.tokenizer
    self._titles = None
    self._apply = jax.jit(lambda params, inputs: self.run.model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        inputs['mlm_positions'], method='pretrain'))

  def _documents(self) -> dict[int, tuple[str, str]]:
    if self._titles is None:
      self._titles = {
          int(b['block_id']): (b['title'].decode(), b['body'].decode())
          for b in corpus.read_blocks(
              self.run.retrieval.corpus_dir).as_numpy_iterator()}
    return self._titles

  def fill(self, text: str, top_tokens: int = 5) -> dict:
    """The filled text, each mask's top tokens under p(y|x), and every
    candidate with p(z|x) and p(y*|z,x) of the filled tokens y*."""
    ids, positions = cloze_query(self.tokenizer, text,
                                 self.run.shapes['query_token_ids'][0])
    query_ids = np.zeros((1, self.run.shapes['query_token_ids'][0]), np.int32)
    query_ids[0, :len(ids)] = ids
    mlm_positions = np.zeros((1, self.run.shapes['mlm_positions'][0]),
                             np.int32)
    mlm_positions[0, :len(positions)] = positions
    query = run_kinds.token_arrays(query_ids)
    blocks, candidate_mask, candidate_ids = self.run.retrieval.candidates(
        self.run.query_embeddings(self.params, query),
        np.array([NULL_DOCUMENT_ID]), self.step)  # Nothing excluded.
    scores, logits = self._apply(self.params, {
        'query': query, 'candidates': blocks, 'mlm_positions': mlm_positions})
    log_p_z, log_p_vocab, log_marginal = (np.asarray(x)[0] for x in
                                          fill_distribution(
                                              scores, candidate_mask, logits))
    masks = len(positions)
    best = np.argmax(log_marginal[:masks], axis=-1)
    filled = list(ids)
    for position, token in zip(positions, best):
      filled[position] = int(token)
    documents = []
    for z, block_id in enumerate(candidate_ids[0]):
      if not candidate_mask[0, z]:
        continue
      title, body = (('(null document)', '') if block_id == NULL_DOCUMENT_ID
                     else self._documents()[int(block_id)])
      documents.append({
          'block_id': int(block_id), 'title': title,
          'text': ' '.join(body.split()[:12]),
          'p_z': float(np.exp(log_p_z[z])),
          'p_y_given_z': [float(np.exp(log_p_vocab[z, j, best[j]]))
                          for j in range(masks)]})
    text_of = lambda ids: self.tokenizer.detokenize(ids).numpy().decode()
    return {
        'filled': text_of(filled[1:-1]),
        'masks': [[(text_of([int(t)]), float(np.exp(log_marginal[j, t])))
                   for t in np.argsort(-log_marginal[j])[:top_tokens]]
                  for j in range(masks)],
        'documents': documents,
        'index_step': self.run.retrieval.client.index_step,
    }
