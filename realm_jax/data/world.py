"""A controlled knowledge world: REALM's claims where they can be shown.

Fictional people, each with a few attributes (a hometown, a birth year, an
occupation, ...) drawn from shared value sets, so that values repeat across
people and only the person's own document tells which is theirs. Each
person with a document has one, stating their facts in one family of
sentence templates (one of two phrasings of each fact, drawn for the
person), and naming a few other people (distractors that share the
name's wordpieces). Masked queries state one fact in another family of
templates, the value masked as the salient span.

People are split three ways: those whose facts are queried in training,
held-out ones whose documents are in the corpus but are never queried in
training (a model without retrieval cannot know their facts beyond the
value prior), and people with no document at all (the null document's
case). Everything is a pure function of the `WorldSpec`, its seed
included.

`write` makes it a corpus the ordinary commands read (`corpus.build_corpus`,
so `corpus add`/`remove`, `search` and the index builder work on it) and
the pre-tokenized query arrays the 'arrays' input source reads, under the
task names of `Pretrain(corpus_name=...)`. (Its ICT pairs are the ordinary
seqio task's, exported by `world_demo.make_world`.)
"""

import dataclasses
import json
import os
import tempfile

import numpy as np
from etils import epath

from realm_jax import default_files, errors
from realm_jax.data import corpus, example_arrays, task_names
from realm_jax.data.tokenization import SPECIAL_TOKENS, WordPieceTokenizer

# Each value is one wordpiece of BERT's uncased vocabulary, so a masked fact
# is one masked token (tests/test_world.py checks).
VALUES = {
    'hometown': ('paris london berlin madrid rome vienna prague oslo lisbon '
                 'dublin cairo tokyo lima athens warsaw budapest helsinki '
                 'moscow boston chicago denver seattle dallas houston toronto '
                 'sydney delhi seoul nairobi havana').split(),
    'birth_year': [str(year) for year in range(1931, 1991, 2)],
    'occupation': ('teacher farmer pilot doctor lawyer baker painter nurse '
                   'engineer writer singer dancer soldier sailor priest judge '
                   'banker chef architect journalist photographer poet actor '
                   'surgeon carpenter librarian tailor miner').split(),
    'instrument': ('piano violin guitar drums flute cello trumpet harp '
                   'clarinet saxophone organ banjo accordion oboe trombone '
                   'tuba mandolin harpsichord horn synthesizer').split(),
    'sport': ('tennis golf soccer hockey cricket rugby baseball basketball '
              'volleyball chess boxing swimming cycling skiing rowing '
              'fencing sailing archery wrestling judo').split(),
}
# The documents' templates ({n}: the person) and the queries' ({n}: the
# person, {v}: the masked value). A person's name is not always a
# sentence's first words: ICT's pseudo-queries are these sentences, and
# towers that learned to match names at the start of a text alone found
# the document of 99% of the queries that start with the name and of 0.5%
# of the others (docs/levers.md). Each attribute has two phrasings, one
# drawn for each person: with one, a person's full name sat in ICT's
# pseudo-queries after "is where" alone, and other people's ("{n} knows
# {m} well") where the first query template names the person; ICT's
# towers of seed 1 then put the person's document among their top 7 for
# 20% of that template's queries (36% with two phrasings), and REALM
# never learned it (docs/levers.md, "The world: the reader's rate and
# where the name sits").
DOCUMENT_TEMPLATES = {
    'hometown': ('The city of {v} is where {n} grew up.',
                 'As a child, {n} lived in the city of {v}.'),
    'birth_year': ('In the year {v}, {n} was born.',
                   'Records show that {n} was born in the year {v}.'),
    'occupation': ('{n} works as a {v}.',
                   'Every day, {n} works as a {v}.'),
    'instrument': ('{n} plays the {v}.',
                   'Most evenings, {n} plays the {v}.'),
    'sport': ('{n} follows the sport of {v} closely.',
              'Each season, {n} follows the sport of {v} closely.'),
}
MENTION_TEMPLATE = '{n} knows {m} well.'
# Each ends as its document's sentence does ("the city of", "the year",
# "a"): the reader finds the value by what precedes it, as a reader of text
# does, while the rest of the sentence is phrased otherwise.
QUERY_TEMPLATES = {
    'hometown': ('the hometown of {n} is the city of {v}.',
                 '{n} spent a childhood in the city of {v}.'),
    'birth_year': ('the birth year of {n} is the year {v}.',
                   '{n} came into the world in the year {v}.'),
    'occupation': ('by profession, {n} is a {v}.',
                   '{n} earns a living as a {v}.'),
    'instrument': ('the instrument of {n} is the {v}.',
                   '{n} performs music on the {v}.'),
    'sport': ('the favourite sport of {n} is the sport of {v}.',
              '{n} loves watching the sport of {v}.'),
}
# Fictional names: a first and a last name, each two ordinary wordpieces
# (a word-initial piece and a continuation).
NAME_STARTS = ('mar tel vin bar fen tam bel dan el hal kal lin nor par sar '
               'tor val wen bran cal dal gil har jan kor lan mel ral sel '
               'tan').split()
NAME_ENDS = ('bel dor gan lin mar nor ran sel tan vin wick ford ley ton '
             'den ric').split()
SPLITS = ('train', 'held_out', 'no_document')
# The world's own vocabulary: the wordpieces of BERT's uncased vocabulary
# its text is made of (templates, values and every name part), the special
# tokens first, padded with [unused] entries to VOCAB_SIZE
# (gin/setups/world.gin's BertConfig.vocab_size). Each BERT then embeds and
# predicts over 512 wordpieces, not 30,522 (the REALM step's vocabulary
# work was a seventh of it on 2 CPU cores: docs/levers.md). WordPiece's
# greedy longest match over a subset of BERT's vocabulary that holds every
# piece it chose there chooses the same pieces: the text tokenizes as it
# did, other ids.
VOCAB_SIZE = 512


@dataclasses.dataclass(frozen=True)
class WorldSpec:
  """How big the world is; `seed` fixes everything else.

  Attributes:
    people: people with a document.
    held_out_share: of those, the share never queried in training.
    no_document: people with facts but no document (queried in evaluation).
    values: values per attribute, at most those in VALUES.
    attributes: which attributes each person has (each of VALUES). Two by
      default: the world preset's 2-layer reader, from random weights,
      learns to copy each attribute's values separately, after hundreds of
      steps each; with birth_year as a third, it copied cities and
      occupations after 1,200 steps but not years (23%, the prior's share).
    mentions: other people each document names.
    first_names / last_names: name parts drawn from; every person's full
      name is distinct, so people + no_document <= their product.
    edited: held-out people whose document the edit check changes.
  """
  people: int = 2000
  held_out_share: float = 0.2
  no_document: int = 100
  values: int = 20
  attributes: tuple[str, ...] = ('hometown', 'occupation')
  mentions: int = 1
  first_names: int = 40
  last_names: int = 60
  edited: int = 100
  seed: int = 0

  def check(self) -> None:
    """Refuses a world that cannot be made, in one line."""
    names = self.first_names * self.last_names
    problems = []
    if self.people < 2:
      problems.append(f'people={self.people}: at least 2 are needed')
    if self.people + self.no_document > names:
      problems.append(
          f'people + no_document = {self.people + self.no_document} exceeds '
          f'the {names} distinct names of first_names={self.first_names} x '
          f'last_names={self.last_names}')
    parts = len(NAME_STARTS) * len(NAME_ENDS)
    for field in ('first_names', 'last_names'):
      if not 1 <= getattr(self, field) <= parts // 2:
        problems.append(f'{field}={getattr(self, field)}: expected 1 to '
                        f'{parts // 2}')
    # NaN and inf fail it too, before round() could meet them.
    if not 0 < self.held_out_share < 1:
      problems.append(f'held_out_share={self.held_out_share}: expected '
                      'strictly between 0 and 1 (some people trained on, '
                      'some held out)')
    else:
      held_out = round(self.people * self.held_out_share)
      if not 0 <= self.edited <= held_out:
        problems.append(f'edited={self.edited}: expected 0 to the {held_out} '
                        'held-out people')
    if not self.attributes:
      problems.append('attributes is empty')
    unknown = sorted(set(self.attributes) - set(VALUES))
    if unknown:
      problems.append(f'attributes {unknown} unknown; expected some of '
                      f'{sorted(VALUES)}')
    smallest = min([len(VALUES[a]) for a in self.attributes if a in VALUES],
                   default=min(len(v) for v in VALUES.values()))
    if not 2 <= self.values <= smallest:
      problems.append(f'values={self.values}: expected 2 to {smallest} '
                      'values per attribute (an empty or single value set '
                      'holds nothing to retrieve)')
    if self.mentions < 0 or self.no_document < 0:
      problems.append('mentions and no_document must not be negative')
    if problems:
      raise errors.BadConfig('World spec: ' + '; '.join(problems) + '.')


@dataclasses.dataclass(frozen=True)
class Person:
  name: str
  facts: dict  # attribute -> value
  split: str  # One of SPLITS.
  mentions: tuple[str, ...] = ()
  phrasings: dict | None = None  # attribute -> DOCUMENT_TEMPLATES' index


@dataclasses.dataclass(frozen=True)
class Query:
  """One masked fact: `text` holds the value at [start, end) (characters)."""
  text: str
  start: int
  end: int
  person: str
  attribute: str
  value: str


class World:
  """The people of a spec, their documents and their queries."""

  def __init__(self, spec: WorldSpec):
    spec.check()
    self.spec = spec
    rng = np.random.default_rng([spec.seed, 2020])
    names = _names(rng, spec)
    # Skewed value frequencies (p ~ 1/(rank + 2)), so that the value prior
    # is a real baseline rather than 1/values.
    weights = 1 / (np.arange(spec.values) + 2)
    weights /= weights.sum()
    self.values = {a: [VALUES[a][i] for i in rng.permutation(spec.values)]
                   for a in spec.attributes}
    held_out = round(spec.people * spec.held_out_share)
    splits = (['held_out'] * held_out + ['train'] * (spec.people - held_out))
    splits = [splits[i] for i in rng.permutation(spec.people)]
    splits += ['no_document'] * spec.no_document
    with_document = names[:spec.people]
    # Its own stream: the rest of the world is drawn as before there were
    # two phrasings.
    phrasing = np.random.default_rng([spec.seed, 3])
    self.people = []
    for i, (name, split) in enumerate(zip(names, splits)):
      facts = {a: self.values[a][rng.choice(spec.values, p=weights)]
               for a in spec.attributes}
      others = [j for j in rng.choice(len(with_document),
                                      spec.mentions + 1, replace=False)
                if j != i][:spec.mentions]
      phrasings = {a: int(phrasing.integers(len(DOCUMENT_TEMPLATES[a])))
                   for a in spec.attributes}
      self.people.append(Person(name, facts, split,
                                tuple(with_document[j] for j in others),
                                phrasings))

  def document(self, person: Person, facts: dict | None = None) -> dict:
    """`{"title", "text"}`: the person's facts (or `facts` instead, the edit
    check's) in the attributes' order, then the people they name; the first
    sentence names the person in full, the others by first name (which
    other people share)."""
    facts = facts or person.facts
    templates = [DOCUMENT_TEMPLATES[a][(person.phrasings or {}).get(a, 0)]
                 .replace('{v}', facts[a]) for a in self.spec.attributes]
    templates += [MENTION_TEMPLATE.replace('{m}', m) for m in person.mentions]
    first_name = person.name.split()[0]
    return {'title': person.name, 'text': ' '.join(
        t.format(n=person.name if i == 0 else first_name)
        for i, t in enumerate(templates))}

  def documents(self) -> list[dict]:
    """One per person with a document, in corpus (block id) order."""
    return [self.document(p) for p in self.people if p.split != 'no_document']

  def queries(self, split: str, facts: dict | None = None) -> list[Query]:
    """Every fact of the split's people in every query template; `facts`:
    person -> {attribute: value} to ask instead (the edit check's)."""
    out = []
    for person in self.people:
      if person.split != split or (facts and person.name not in facts):
        continue
      for attribute, value in (facts or {}).get(person.name,
                                                person.facts).items():
        for template in QUERY_TEMPLATES[attribute]:
          before, after = template.split('{v}')
          before = before.format(n=person.name)
          out.append(Query(before + value + after.format(n=person.name),
                           len(before), len(before) + len(value),
                           person.name, attribute, value))
    return out

  def edits(self) -> dict[str, dict]:
    """The edit check's facts: for `spec.edited` held-out people, one
    attribute changed to another value of its set."""
    rng = np.random.default_rng([self.spec.seed, 1])
    held_out = [p for p in self.people if p.split == 'held_out']
    out = {}
    for person in held_out[:self.spec.edited]:
      attribute = self.spec.attributes[rng.integers(len(self.spec.attributes))]
      others = [v for v in self.values[attribute]
                if v != person.facts[attribute]]
      out[person.name] = {attribute: others[rng.integers(len(others))]}
    return out

  def prior(self) -> dict[str, str]:
    """Each attribute's most frequent value among the training people: what
    a model that cannot know a held-out fact should answer."""
    out = {}
    for attribute in self.spec.attributes:
      counts = {}
      for p in self.people:
        if p.split == 'train':
          counts[p.facts[attribute]] = counts.get(p.facts[attribute], 0) + 1
      out[attribute] = max(sorted(counts), key=counts.get)
    return out


def _names(rng, spec: WorldSpec) -> list[str]:
  """Distinct 'First Last' names, first and last parts from disjoint pools."""
  parts = [(s + e).capitalize() for s in NAME_STARTS for e in NAME_ENDS]
  parts = [parts[i] for i in rng.permutation(len(parts))]
  firsts = parts[:spec.first_names]
  lasts = parts[spec.first_names:spec.first_names + spec.last_names]
  pairs = rng.permutation(spec.first_names * spec.last_names)
  count = spec.people + spec.no_document
  return [f'{firsts[i // spec.last_names]} {lasts[i % spec.last_names]}'
          for i in pairs[:count]]


def _words() -> list[str]:
  """Every word any world's text can hold: its templates, the values of
  every attribute and every name part."""
  templates = [t for family in (DOCUMENT_TEMPLATES, QUERY_TEMPLATES)
               for phrasings in family.values() for t in phrasings]
  return ([t.format(n='', v='', m='') for t in templates + [MENTION_TEMPLATE]]
          + [v for values in VALUES.values() for v in values]
          + [(s + e).capitalize() for s in NAME_STARTS for e in NAME_ENDS])


def vocabulary(bert_vocab: str) -> list[str]:
  """The world's VOCAB_SIZE wordpieces, drawn from `bert_vocab` (BERT's
  uncased vocab.txt) in its order."""
  bert = WordPieceTokenizer(bert_vocab)
  used = {i for ids in bert.encode(_words()) for i in ids}
  if bert.unk_id in used:
    raise errors.BadInput(f'{bert_vocab} lacks wordpieces of the world\'s '
                          'words (they tokenize to [UNK]).')
  pieces = list(SPECIAL_TOKENS) + [bert.vocab[i] for i in sorted(used)]
  if len(pieces) > VOCAB_SIZE:
    raise errors.BadConfig(f'The world\'s text needs {len(pieces)} '
                           f'wordpieces; VOCAB_SIZE is {VOCAB_SIZE}.')
  return pieces + [f'[unused{i}]' for i in range(VOCAB_SIZE - len(pieces))]


def write_vocabulary(path: str) -> str:
  """The world's vocabulary at `path` (from the embedded default's BERT
  vocabulary); returns `path`."""
  epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
  epath.Path(path).write_text(''.join(
      f'{piece}\n' for piece in vocabulary(default_files.minilm_vocab())))
  return path


def check_covered(tokenizer: WordPieceTokenizer, texts) -> None:
  """Refuses text with a word the tokenizer's vocabulary lacks: it would
  read as [UNK], and a world written so answers nothing right."""
  for text in texts:
    if tokenizer.unk_id in tokenizer.encode([text])[0]:
      raise errors.BadInput(
          f'The world\'s text {text!r} has wordpieces that '
          f'{tokenizer.vocab_path} lacks (they read as [UNK]).')


# Task names of the world's query arrays beyond Pretrain's own
# (task_names.pretrain(corpus, 'salient') and task_names.held_out(corpus)).
def no_document_task(corpus_name: str) -> str:
  return task_names.held_out(corpus_name) + '_no_document'


def edited_task(corpus_name: str) -> str:
  return task_names.held_out(corpus_name) + '_edited'


def query_arrays(queries: list[Query], tokenizer: WordPieceTokenizer,
                 block_ids: dict[str, int], query_length: int,
                 max_masked: int) -> list[dict]:
  """Pretrain's features of each query: `[CLS] query [SEP]` with the value's
  wordpieces masked, their positions and targets, and `block_id` the
  person's own document (NULL -1 for none)."""
  out = []
  check_covered(tokenizer, (q.text for q in queries))
  for query in queries:
    pieces = tokenizer.tokenize_with_offsets([query.text])[0]
    ids, masked = [tokenizer.cls_id], []
    for token, (start, end) in zip(*pieces):
      text_start = len(query.text.encode()[:start].decode())
      text_end = len(query.text.encode()[:end].decode())
      if query.start <= text_start and text_end <= query.end:
        masked.append((len(ids), token))
        token = tokenizer.mask_id
      ids.append(token)
    ids.append(tokenizer.sep_id)
    if len(ids) > query_length or not 0 < len(masked) <= max_masked:
      raise errors.BadConfig(
          f'The world query {query.text!r} is {len(ids)} wordpieces with '
          f'{len(masked)} masked; the run reads {query_length} and '
          f'{max_masked} (Pretrain.query_length, Pretrain.max_masked).')
    out.append({'query_token_ids': ids,
                'mlm_positions': [p for p, _ in masked],
                'mlm_targets': [t for _, t in masked],
                'block_id': block_ids.get(query.person, -1)})
  return out


def write(world: World, corpus_name: str = 'world', query_length: int = 24,
          max_masked: int = 2, arrays_root: str | None = None) -> dict:
  """Builds the world's corpus (corpus.corpus_dir(corpus_name)) and writes
  its query arrays: training queries (train split; its validation split and
  the held-out task hold the held-out people's) and the people without a
  document. Returns the corpus metadata."""
  tokenizer = WordPieceTokenizer(default_files.task_vocab())
  check_covered(tokenizer, (f'{d["title"]} {d["text"]}'
                            for d in world.documents()))
  directory = corpus.corpus_dir(corpus_name)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, f'{corpus_name}.jsonl')
    epath.Path(path).write_text(''.join(
        json.dumps(d) + '\n' for d in world.documents()))
    metadata = corpus.build_corpus(directory, tokenizer, jsonl_paths=[path])
  documented = [p for p in world.people if p.split != 'no_document']
  if metadata['num_blocks'] != len(documented):
    raise RuntimeError(f'{len(documented)} documents made '
                       f'{metadata["num_blocks"]} blocks: one each expected.')
  block_ids = {p.name: i for i, p in enumerate(documented)}
  write_queries(world, corpus_name, tokenizer, block_ids, query_length,
                max_masked, arrays_root)
  return metadata


def write_queries(world: World, corpus_name: str, tokenizer, block_ids,
                  query_length: int, max_masked: int,
                  arrays_root: str | None = None, edits: dict | None = None,
                  task: str | None = None) -> None:
  """The query arrays of `write`; with `edits` (person -> {attribute:
  value}), those facts' queries alone as `task` (default `edited_task`),
  checked against the corpus as it is now (the edited one)."""
  shapes = {'query_token_ids': (query_length,), 'mlm_positions': (max_masked,),
            'mlm_targets': (max_masked,), 'block_id': ()}
  fingerprint = corpus.load_metadata(
      corpus.corpus_dir(corpus_name))['corpus_fingerprint']
  salient = task_names.pretrain(corpus_name, 'salient')
  if edits is None:
    tasks = [(salient, 'train', 'train'), (salient, 'validation', 'held_out'),
             (task_names.held_out(corpus_name), 'validation', 'held_out'),
             (no_document_task(corpus_name), 'validation', 'no_document')]
  else:
    tasks = [(task or edited_task(corpus_name), 'validation', 'held_out')]
  for name, split, people in tasks:
    queries = world.queries(people, edits)
    example_arrays.write(
        example_arrays.directory(name, split, arrays_root),
        query_arrays(queries, tokenizer, block_ids, query_length, max_masked),
        shapes, task=name, split=split, seed=world.spec.seed,
        world=dataclasses.asdict(world.spec),
        vocab_fingerprint=corpus.vocab_hash(tokenizer.vocab_path),
        corpus_name=corpus_name, corpus_fingerprint=fingerprint)
