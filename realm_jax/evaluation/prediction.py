"""Predictions with provenance from a training run's model_dir.

Both predictors rebuild the run from its directory (`run_loader.load_run`:
its saved gin config), a checkpoint's parameters and an index.
`ClozePredictor` fills the [MASK]s of a sentence with a pre-training run and
shows, as the paper's Table 3 does, the marginal p(y|x) over the retrieved
candidates (the null document included) and each candidate's p(z|x) and
p(y|z,x). `QAPredictor` answers questions with a fine-tuning run, with the
same provenance, and retrieves for any run. Both are built once and then
answer any number of inputs (`read_inputs`): their start-up is paid once.
"""

import contextlib
import functools
import sys
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from realm_jax import errors, run_directory
from realm_jax.data import corpus_changes
from realm_jax.data.skips import SkipReport
from realm_jax.evaluation.answers import BlockTexts, answers_of, block_segments
from realm_jax.models import losses
from realm_jax.models.candidates import NULL_DOCUMENT_ID
from realm_jax.models.reader import BEST_SPAN, span_mask
from realm_jax.progress import Stopwatch
from realm_jax.training import partitioning, step_inputs
from realm_jax.training.run_loader import load_run

MASK = '[MASK]'
# Wordpieces of a question for `search` and `ask` on a run that trained on
# no questions (ICT, pre-training); a fine-tuning run cuts them at its own.
QUESTION_LENGTH = 64


def cloze_query(tokenizer, text: str, max_length: int):
  """`[CLS] text [SEP]` ids with each '[MASK]' as one mask token, and the mask
  positions."""
  pieces = text.split(MASK)
  if len(pieces) < 2:
    raise errors.BadInput(f'No {MASK} in {text!r}.', 'Write [MASK] where '
                          'a token is to be filled, e.g. "The [MASK] is the '
                          'currency of the United Kingdom."')
  tokens = tokenizer.encode(pieces)
  ids = [tokenizer.cls_id]
  positions = []
  for i, piece in enumerate(tokens):
    if i:
      positions.append(len(ids))
      ids.append(tokenizer.mask_id)
    ids.extend(piece)
  ids.append(tokenizer.sep_id)
  if len(ids) > max_length:
    raise errors.BadInput(f'{text!r} is {len(ids)} wordpieces with [CLS] and '
                          f'[SEP]; the query holds {max_length}.')
  return ids, positions


def read_inputs(path: str, report: SkipReport) -> Iterator[tuple[str, str]]:
  """(file:line, text) of each non-blank line of `path` ('-': standard
  input), read as it comes, so that inputs can be piped or typed; lines
  that are not UTF-8 are counted in `report`."""
  if path != '-':
    errors.require_file(path, 'file of inputs')
  return _numbered_lines(path, report)


def _numbered_lines(path, report):
  name = '<stdin>' if path == '-' else path
  with (contextlib.nullcontext(sys.stdin.buffer) if path == '-'
        else epath.Path(path).open('rb')) as lines:
    for number, raw in enumerate(lines, 1):
      try:
        text = raw.decode('utf-8').strip()
      except UnicodeDecodeError:
        report.add('not UTF-8', f'{name}:{number}')
        continue
      if text:
        yield f'{name}:{number}', text


def _check_text(text: str, what: str) -> None:
  if not text.strip():
    raise errors.BadInput(f'The {what} is empty.', f'Give a {what} in words.')


def fill_distribution(scores, candidate_mask, mlm_logits):
  """(log p(z|x) [B, k], log p(y_j|z,x) [B, k, M, V], log p(y_j|x) [B, M, V])."""
  log_p_z = losses.candidate_log_probs(scores, candidate_mask)
  log_p_vocab = jax.nn.log_softmax(mlm_logits.astype(jnp.float32), axis=-1)
  return log_p_z, log_p_vocab, losses.marginal_token_log_probs(
      log_p_z, log_p_vocab, candidate_mask)


# The run kind a reader's command needs: (what it does, what to use on a
# run of another kind).
READERS = {
    'Pretrain': ("fills [MASK]s with a pre-training run's reader",
                 '`realm-jax ask` answers questions with a fine-tuning run; '
                 '`realm-jax search` shows what any run retrieves.'),
    'Finetune': ("answers questions with a fine-tuning run's reader",
                 '`realm-jax fill` fills the [MASK]s of a pre-training run; '
                 '`realm-jax search` shows what any run retrieves.'),
}
KIND_NAMES = {'Ict': 'an ICT run (a retriever without a reader)',
              'Pretrain': 'a pre-training run',
              'Finetune': 'a fine-tuning run'}


class RestoredRun:
  """A run rebuilt from its model_dir on one device (`load_run`: its saved
  gin config, then any `gin_files`/`gin_bindings` layered over it) with the
  parameters of checkpoint `step` (default the newest), of the `towers`
  named alone. Subclasses add the retrieval they need (`self.retrieval`).

  `reader`: the run kind whose reader the caller needs; a run of another
  kind is refused (`errors.WrongRunKind`) by its saved config, before
  anything is restored.
  """

  def __init__(self, model_dir: str, step: int | None = None, gin_files=(),
               gin_bindings=(), reader: str | None = None,
               towers=('retriever', 'reader')):
    self.stopwatch = Stopwatch()  # Where the start-up's seconds go.
    with self.stopwatch('config'):
      self.loaded = load_run(model_dir, gin_files, gin_bindings)
    self.model_dir, self.run = self.loaded.model_dir, self.loaded.run
    self.kind, self.source = self.loaded.kind, self.loaded.source
    if reader is not None and self.kind != reader:
      does, instead = READERS[reader]
      raise errors.WrongRunKind(
          f'This command {does} ({reader}); {self.model_dir} is '
          f'{KIND_NAMES.get(self.kind, self.kind)} ({self.kind}).', instead)
    # One question at a time, or small batches: a one-device mesh.
    self.mesh = partitioning.make_mesh(1, 1, devices=jax.local_devices()[:1])
    with self.stopwatch('parameters'):
      self.step, self.params = run_directory.restore_params(
          self.model_dir, step, towers)
    self.tokenizer = step_inputs.task_tokenizer()
    self.retrieval = None
    self._texts = None

  @property
  def texts(self) -> BlockTexts:
    if self._texts is None:
      with self.stopwatch('texts'):
        self._texts = BlockTexts(self.retrieval.corpus_dir, self.tokenizer)
    return self._texts

  def query(self, texts, length: int) -> dict:
    """`[CLS] text [SEP]` token arrays of questions, cut to `length`."""
    return self.tokenizer.numpy_join(list(texts), max_length=length)

  def document(self, block_id: int) -> tuple[str, str]:
    """(title, the first words of the body) of a block."""
    if block_id == NULL_DOCUMENT_ID:
      return '(null document)', ''
    return (self.texts.titles[block_id],
            ' '.join(self.texts.bodies[block_id].split()[:12]))


class ClozePredictor(RestoredRun):
  """Fills [MASK]s with a pre-training run's newest parameters and index."""

  def __init__(self, model_dir: str, gin_files=(), gin_bindings=()):
    super().__init__(model_dir, gin_files=gin_files, gin_bindings=gin_bindings,
                     reader='Pretrain')
    with self.stopwatch('retrieval'):
      self.preparer = self.run.input_preparer(self.model_dir, self.mesh)
      self.retrieval = self.preparer.retrieval
      self.retrieval.client.maybe_refresh()
    model = self.run.objective.model
    self._apply = jax.jit(lambda params, inputs: model.apply(
        {'params': params}, inputs['query'], inputs['candidates'],
        inputs['mlm_positions'], method='pretrain'))

  def fill(self, text: str, top_tokens: int = 5) -> dict:
    """The filled text, each mask's top tokens under p(y|x), and every
    candidate with p(z|x) and p(y*|z,x) of the filled tokens y*."""
    ids, positions = cloze_query(self.tokenizer, text,
                                 self.run.shapes['query_token_ids'][0])
    max_masks = self.run.shapes['mlm_positions'][0]  # The run's max_masked.
    if len(positions) > max_masks:
      raise errors.BadInput(f'{text!r} has {len(positions)} {MASK}s; this run '
                            f'fills at most {max_masks} a sentence.',
                            f'Give {max_masks} or fewer.')
    query_ids = np.zeros((1, self.run.shapes['query_token_ids'][0]), np.int32)
    query_ids[0, :len(ids)] = ids
    mlm_positions = np.zeros((1, self.run.shapes['mlm_positions'][0]),
                             np.int32)
    mlm_positions[0, :len(positions)] = positions
    query = step_inputs.token_arrays(query_ids)
    blocks, candidate_mask, candidate_ids = self.retrieval.candidates(
        self.retrieval.query_embeddings(self.params['retriever'], query),
        np.array([NULL_DOCUMENT_ID]))  # Nothing excluded.
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
      title, words = self.document(int(block_id))
      documents.append({
          'block_id': int(block_id), 'title': title, 'text': words,
          'p_z': float(np.exp(log_p_z[z])),
          'p_y_given_z': [float(np.exp(log_p_vocab[z, j, best[j]]))
                          for j in range(masks)]})
    text_of = self.tokenizer.decode
    return {
        'filled': text_of(filled[1:-1]),
        'masks': [[(text_of([int(t)]), float(np.exp(log_marginal[j, t])))
                   for t in np.argsort(-log_marginal[j])[:top_tokens]]
                  for j in range(masks)],
        'documents': documents,
        'index_step': self.retrieval.client.index_step,
    }


def read_answers(model, params, inputs, top_spans: int) -> dict:
  """The span reader over the candidates, reduced to what answers need.

  Returns a dict of 'log_p_z' [B, k], the retriever's log p(z|x);
  'log_p_z_joint' [B, k], log sum_s p(z, s|x) under the joint
  p(z, s|x) ∝ exp(f(x, z) + S(z, s)) that fine-tuning trains; and for each
  candidate its `top_spans` best spans: 'span_log_p' log p(s|z,x) [B, k, N]
  (softmax over the spans inside z), 'starts' and 'widths' [B, k, N]; and
  'reader_ids', the reader's token ids [B, k, L].
  """
  scores, spans, reader_inputs = model.apply(
      {'params': params}, inputs['query'], inputs['candidates'],
      inputs['candidate_embeddings'], method='read_spans')
  mask = inputs['candidate_mask']
  spans = spans.astype(jnp.float32)
  valid = span_mask(reader_inputs['block_mask'], model.max_span_width) & (
      mask[:, :, None, None])
  log_normalizer = losses.masked_logsumexp(spans, valid, axis=(2, 3))
  log_p_span = jnp.where(valid, spans - log_normalizer[..., None, None],
                         -jnp.inf)
  batch, k, length, width = spans.shape
  top, index = jax.lax.top_k(log_p_span.reshape(batch, k, length * width),
                             top_spans)
  return {'log_p_z': losses.candidate_log_probs(scores, mask),
          'log_p_z_joint': losses.candidate_log_probs(
              scores + log_normalizer, mask & jnp.isfinite(log_normalizer)),
          'span_log_p': top, 'starts': index // width,
          'widths': index % width, 'reader_ids': reader_inputs['token_ids']}


class QAPredictor(RestoredRun):
  """Open-QA with provenance: answers of a fine-tuning run, or the top blocks
  alone of any run (ICT, pre-training, fine-tuning).

  A fine-tuning run with its document tower frozen reads with the index it
  trained with. Any other run (one that trained its document tower too) is
  a retriever under evaluation: it searches the index of its own step,
  embedded now if none was published.
  """

  def __init__(self, model_dir: str, step: int | None = None, gin_files=(),
               gin_bindings=(), top_k: int = 100, top_spans: int = 8,
               question_length: int = QUESTION_LENGTH, read: bool = True,
               answers_only: bool = False):
    """`top_k`: blocks retrieved per question, at most every live block.
    `question_length`: wordpieces of a question for a run that is not
    fine-tuned (Finetune's default); a fine-tuning run reads its own. A
    fine-tuning run picks answers by its `Finetune.answer_rule`. `read`:
    False retrieves alone, even with a fine-tuning run (its reader is not
    restored). `answers_only`: refuse any run but a fine-tuning run."""
    finetuned = 'Finetune'
    super().__init__(model_dir, step, gin_files, gin_bindings,
                     reader=finetuned if answers_only else None,
                     towers=('retriever', 'reader') if read else
                     ('retriever',))
    self.reads = read and self.kind == finetuned
    self.answer_rule = self.run.answer_rule if self.reads else None
    self.query_length = (self.run.shapes['query_token_ids'][0]
                         if self.kind == finetuned else question_length)
    # A fine-tuning run with its document tower frozen reads with the index
    # it trained with.
    own_index = self.kind == finetuned and (
        not self.run.objective.train_document_tower)
    with self.stopwatch('retrieval'):
      if self.reads:
        self.preparer = self.run.input_preparer(self.model_dir, self.mesh)
        self.retrieval = self.preparer.retrieval
        self.num_candidates = self.run.objective.num_candidates
        self._read = jax.jit(functools.partial(
            read_answers, self.run.objective.model, top_spans=top_spans))
      else:
        self.retrieval = step_inputs.corpus_retrieval(
            self.model_dir, self.mesh, self.run.retriever(), self.tokenizer,
            self.run.corpus_name, top_k, block_length=self.run.block_length)
        self.preparer, self.num_candidates = None, 0
      if own_index:
        self.retrieval.client.maybe_refresh()
      else:
        self.retrieval.index_at(self.step, self.params['retriever'])
    # Removed blocks keep their rows in the index but are never returned.
    client = self.retrieval.client
    self.top_k = min(top_k, client.searcher.num_docs - len(
        corpus_changes.removed_ids(client.corpus_metadata)))

  def predict(self, query: dict) -> list[dict]:
    """Per question: the top `top_k` blocks (ids, retrieval scores) and,
    for a fine-tuning run, its answers (`answers.Answer`), most probable
    first, with the candidates' p(z|x)."""
    retrieval = self.retrieval
    fetch = max(self.top_k, self.num_candidates)
    scores, ids = retrieval.client.search(
        retrieval.query_embeddings(self.params['retriever'], query), fetch)
    scores, ids = np.asarray(scores), np.asarray(ids)
    results = [{'block_ids': [int(i) for i in row[:self.top_k]],
                'retrieval_scores': [float(s) for s in srow[:self.top_k]]}
               for row, srow in zip(ids, scores)]
    if not self.reads:
      return results
    candidate_ids = ids[:, :self.num_candidates]
    blocks = retrieval.blocks_of(candidate_ids)
    outputs = self._read(self.params, {
        'query': query, 'candidates': blocks,
        'candidate_mask': candidate_ids >= 0,
        'candidate_embeddings': retrieval.client.document_embeddings(
            candidate_ids)})
    read = {name: np.asarray(x) for name, x in outputs.items()}
    log_p_z = read['log_p_z_joint' if self.answer_rule == BEST_SPAN
                   else 'log_p_z']
    query_lengths = np.sum(query['input_mask'], axis=-1)
    self.texts.prepare(candidate_ids[candidate_ids >= 0])  # One batch.
    for b, result in enumerate(results):
      locate = block_segments(blocks['token_type_ids'][b],
                              int(query_lengths[b]),
                              self.run.objective.model.include_title)
      result['candidates'] = [
          {'block_id': int(z_id), 'p_z': float(np.exp(read['log_p_z'][b, z]))}
          for z, z_id in enumerate(candidate_ids[b]) if z_id >= 0]
      result['answers'] = answers_of(
          self.texts, candidate_ids[b], log_p_z[b], read['span_log_p'][b],
          read['starts'][b], read['widths'][b], read['reader_ids'][b], locate,
          rule=self.answer_rule)
    return results

  def search(self, query: str) -> dict:
    """One query's top `top_k` blocks: title, opening words, retrieval score
    and p(z|x) under the softmax over those k."""
    _check_text(query, 'query')
    result = self.predict(self.query([query], self.query_length))[0]
    scores = np.array(result['retrieval_scores'], np.float64)
    p_z = np.exp(scores - scores.max())
    p_z /= p_z.sum()
    blocks = []
    for block_id, score, p in zip(result['block_ids'], scores, p_z):
      title, words = self.document(block_id)
      blocks.append({'block_id': block_id, 'title': title, 'text': words,
                     'score': float(score), 'p_z': float(p)})
    return {'query': query, 'kind': self.kind, 'step': self.step,
            'index_step': self.retrieval.client.index_step, 'blocks': blocks}

  def ask(self, question: str) -> dict:
    """One question: its best answer, p(y|x), and each candidate block with
    p(z|x) and p(y|z,x) of that answer."""
    if not self.reads:
      raise errors.WrongRunKind(
          f'{self.model_dir} is {KIND_NAMES[self.kind]} ({self.kind}), or '
          'was loaded without its reader: answers need a fine-tuning run.')
    _check_text(question, 'question')
    result = self.predict(self.query([question], self.query_length))[0]
    best = result['answers'][0] if result['answers'] else None
    blocks = []
    for candidate in result['candidates']:
      title, words = self.document(candidate['block_id'])
      blocks.append({**candidate, 'title': title, 'text': words,
                     'p_y_given_z': (best.per_block.get(candidate['block_id'],
                                                        0.0) if best else 0.0)})
    return {'question': question, 'answer_rule': self.answer_rule,
            'answer': best.text if best else '',
            'p_answer': best.probability if best else 0.0,
            'alternatives': [(a.text, a.probability)
                             for a in result['answers'][1:]],
            'blocks': blocks, 'step': self.step,
            'index_step': self.retrieval.client.index_step}
