"""Answer strings from the span reader, in the words of the block they came from.

Two rules pick the answer (`reader.ANSWER_RULES`):
- 'marginal', REALM's Open-QA model as section 3.2 writes it: a string y
  scores p(y|x) = sum_z p(z|x) p(y|z,x), where p(y|z,x) sums the reader's
  span probabilities p(s|z,x) over the spans s of z that spell y;
- 'best_span', what ORQA's code (with which REALM fine-tuned and scored
  its released models) predicts: the single span s of block z with the
  highest f(x, z) + S(z, s), the mode of the joint p(z, s|x) that the
  fine-tuning loss trains; a string scores its best span's p(z, s|x).

The reader sees wordpieces; the answer shown to a person (and scored by
exact match) is the stretch of the block's own text those wordpieces cover,
with its casing, accents and spacing.
"""

import collections.abc
import dataclasses

import numpy as np

from realm_jax.data import block_store, corpus, corpus_changes
from realm_jax.data.answer_matching import normalize_answer
from realm_jax.models.candidates import NULL_DOCUMENT_ID
from realm_jax.models.reader import BEST_SPAN, MARGINAL


class _Texts(collections.abc.Mapping):
  """Block id -> text of the live blocks, decoded from the store on use."""

  def __init__(self, text_of, live: list[int]):
    self._text_of, self._live, self._alive = text_of, live, set(live)

  def __getitem__(self, block_id: int) -> str:
    if block_id not in self._alive:
      raise KeyError(block_id)
    return self._text_of(block_id)

  def __iter__(self):
    return iter(self._live)

  def __len__(self) -> int:
    return len(self._live)


class BlockTexts:
  """The title and body of every live block of a corpus (removed ones
  left out), from its block store, and the text of a span."""

  def __init__(self, corpus_dir: str, tokenizer):
    self.tokenizer = tokenizer
    # A few blocks are read, each piece checked as it is.
    store = block_store.open_store(corpus_dir, whole=False)
    removed = set(corpus_changes.removed_ids(
        corpus.load_metadata(corpus_dir)).tolist())
    live = [i for i in range(store.num_blocks) if i not in removed]
    self.titles = _Texts(store.title, live)
    self.bodies = _Texts(store.body, live)
    # segment -> block id -> (UTF-8 text, wordpiece ids, byte offsets)
    self._pieces = {'title': {}, 'body': {}}
    # Spans whose wordpieces did not line up with the text (counted, shown
    # as detokenized wordpieces instead).
    self.unaligned = 0

  def prepare(self, block_ids) -> None:
    """Tokenizes the titles and bodies of `block_ids` not seen before, in
    one batched call per segment: the blocks whose spans are read next."""
    for segment, texts in (('title', self.titles), ('body', self.bodies)):
      pieces = self._pieces[segment]
      new = sorted({int(i) for i in block_ids} - set(pieces))
      if not new:
        continue
      tokenized = self.tokenizer.tokenize_with_offsets(
          [texts[i] for i in new])
      for i, tokens in zip(new, tokenized):
        pieces[i] = (texts[i].encode('utf-8'), *tokens)

  def _tokens(self, block_id: int, segment: str):
    """(UTF-8 bytes, wordpiece ids, byte offsets) of a block's title or
    body."""
    if block_id not in self._pieces[segment]:
      self.prepare([block_id])
    return self._pieces[segment][block_id]

  def span_text(self, block_id: int, segment: str, first: int, last: int,
                token_ids) -> str:
    """The text of wordpieces first..last of a block's title or body.

    `token_ids` are the wordpieces the reader saw there; if the text does
    not tokenize to them (it always should), the detokenized wordpieces are
    returned and counted in `unaligned`.
    """
    token_ids = [int(t) for t in token_ids]
    raw, ids, offsets = self._tokens(block_id, segment)
    if first >= 0 and last < len(ids) and ids[first:last + 1] == token_ids:
      return raw[offsets[first][0]:offsets[last][1]].decode('utf-8')
    self.unaligned += 1
    return self.tokenizer.decode(token_ids)


@dataclasses.dataclass
class Answer:
  """One answer string and where its probability comes from."""
  text: str
  # p(y|x) ('marginal'), or p(z, s|x) of its best span ('best_span').
  probability: float
  # block id -> p(y|z,x), for every candidate z with a span spelling y.
  per_block: dict[int, float]


def block_segments(block_token_type_ids, query_length: int,
                   include_title: bool):
  """For each candidate, where its title and body start in the reader input.

  Returns a function (z, position) -> (segment, index in that segment), or
  None for a position on a separator.
  """
  # Block tokens are `[CLS] title [SEP] body [SEP]`, type 0 up to the first
  # [SEP]; the reader input is `[CLS] x [SEP]` then the block from its title
  # (include_title) or its body on (see candidates.join_query_and_blocks).
  title_lengths = np.sum(np.asarray(block_token_type_ids) == 0, axis=-1)

  def locate(z: int, position: int):
    title_length = int(title_lengths[z])  # [CLS] title [SEP]
    block_start = 1 if include_title else title_length
    index = block_start + position - query_length
    if 1 <= index < title_length - 1:
      return 'title', index - 1
    if index >= title_length:
      return 'body', index - title_length
    return None

  return locate


def answers_of(texts: BlockTexts, candidate_ids, log_p_z, span_log_probs,
               span_starts, span_widths, reader_token_ids, locate,
               max_answers: int = 5, rule: str = MARGINAL) -> list[Answer]:
  """The answer strings of one question, most probable first under `rule`.

  Args:
    texts: the corpus' text.
    candidate_ids: [k] block ids (NULL_DOCUMENT_ID on padding).
    log_p_z: [k] log p(z|x), -inf on padding: the retriever's softmax of
      f(x, z) for 'marginal'; for 'best_span' the joint's
      p(z|x) = sum_s p(z, s|x), so that log_p_z + log p(s|z,x) is
      f(x, z) + S(z, s) up to one constant.
    span_log_probs: [k, N] log p(s|z,x) of each candidate's N best spans.
    span_starts / span_widths: [k, N] reader positions of those spans.
    reader_token_ids: [k, L] reader inputs.
    locate: see `block_segments`.
    max_answers: how many strings to return.
    rule: 'marginal' or 'best_span' (the module's docstring).

  p(y|z,x) only counts the N best spans of z: the rest carry the remainder
  of its probability mass, which no answer then claims.
  """
  by_key: dict[str, Answer] = {}
  best_joint: dict[str, float] = {}
  for z, block_id in enumerate(np.asarray(candidate_ids)):
    if block_id == NULL_DOCUMENT_ID or not np.isfinite(log_p_z[z]):
      continue
    for log_p, start, width in zip(span_log_probs[z], span_starts[z],
                                   span_widths[z]):
      if not np.isfinite(log_p):
        continue
      first = locate(z, int(start))
      last = locate(z, int(start) + int(width))
      if first is None or last is None or first[0] != last[0]:
        continue  # A span across the title/body separator.
      text = texts.span_text(
          int(block_id), first[0], first[1], last[1],
          reader_token_ids[z][int(start):int(start) + int(width) + 1])
      key = normalize_answer(text)
      if not key:
        continue
      answer = by_key.setdefault(key, Answer(text, 0.0, {}))
      p_s = float(np.exp(log_p))
      answer.per_block[int(block_id)] = answer.per_block.get(
          int(block_id), 0.0) + p_s
      answer.probability += float(np.exp(log_p_z[z])) * p_s
      joint = float(log_p_z[z] + log_p)
      if joint > best_joint.get(key, -np.inf):
        best_joint[key], answer.text = joint, text  # Its likeliest wording.
  if rule == BEST_SPAN:
    for key, answer in by_key.items():
      answer.probability = float(np.exp(best_joint[key]))
  return sorted(by_key.values(), key=lambda a: -a.probability)[:max_answers]
