"""The block store: the shards' blocks, written once, memory-mapped after."""

import json

import numpy as np
import pytest

from realm_jax import checksums, errors, extras
from realm_jax.data import block_store, corpus, corpus_changes
from realm_jax.data.open_corpus import OpenCorpus
from tests.helpers import ARTICLES, flip_a_bit

pytestmark = pytest.mark.unit


@pytest.fixture
def zebra_corpus(tmp_path, tokenizer):
  source = tmp_path / 'articles.jsonl'
  source.write_text(''.join(json.dumps(a) + '\n' for a in ARTICLES))
  directory = str(tmp_path / 'wiki_leads')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[str(source)])
  return directory


def test_articles_number_each_run_of_one_title_and_siblings_stay_in_it(
    tmp_path, tokenizer):
  """Cut at 32 wordpieces, an article is several blocks in a row; each
  draw is another block of the same article, any of them, never the block
  itself, and the null id for an article of one block."""
  source = tmp_path / 'articles.jsonl'
  sentence = 'The zebra runs across the wide plain at dawn.'
  rows = [{'title': 'Zebra', 'text': ' '.join([sentence] * 6)},
          {'title': 'Okapi', 'text': 'The okapi lives in the forest.'},
          {'title': 'Horse', 'text': ' '.join([sentence] * 3)}]
  source.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  directory = str(tmp_path / 'animals')
  corpus.build_corpus(directory, tokenizer, jsonl_paths=[str(source)],
                      max_block_length=32)
  store = block_store.open_store(directory)
  articles = store.articles()
  titles = [store.title(i) for i in range(store.num_blocks)]
  assert [titles[i] for i in np.unique(articles, return_index=True)[1]] == [
      'Zebra', 'Okapi', 'Horse']
  assert all(titles[i] == ('Zebra', 'Okapi', 'Horse')[a]
             for i, a in enumerate(articles))
  zebra = [i for i, t in enumerate(titles) if t == 'Zebra']
  assert len(zebra) >= 3
  rng = np.random.default_rng(0)
  ids = np.array(zebra * 200 + [titles.index('Okapi')])
  drawn = block_store.draw_siblings(articles, ids, rng, -1)
  assert drawn[-1] == -1  # The okapi has no other block.
  for block in zebra:
    of_it = set(drawn[:-1][ids[:-1] == block].tolist())
    assert of_it == set(zebra) - {block}


def test_the_store_holds_what_the_shards_hold(zebra_corpus):
  store = block_store.open_store(zebra_corpus)
  blocks = list(corpus.read_blocks(zebra_corpus).as_numpy_iterator())
  assert store.num_blocks == len(blocks) == 12
  for i, block in enumerate(blocks):
    assert store.title(i) == block['title'].decode()
    assert store.body(i) == block['body'].decode()
    np.testing.assert_array_equal(store.token_ids(i), block['token_ids'])
  longest = max(len(b['token_ids']) for b in blocks)
  for length in (8, 16, longest, 64):  # Cut, and not.
    padded = store.padded(length)
    for i, block in enumerate(blocks):
      # A cut block keeps its first length - 1 wordpieces and its [SEP];
      # type 1 starts after [CLS] title [SEP].
      ids = block['token_ids'].tolist()
      kept = ids if len(ids) <= length else ids[:length - 1] + ids[-1:]
      pad = [0] * (length - len(kept))
      body = [int(j >= int(block['title_length']) + 2)
              for j in range(len(kept))]
      np.testing.assert_array_equal(padded['token_ids'][i], kept + pad)
      np.testing.assert_array_equal(padded['input_mask'][i],
                                    [1] * len(kept) + pad)
      np.testing.assert_array_equal(padded['token_type_ids'][i], body + pad)
    assert {a.dtype for a in padded.values()} == {np.dtype(np.int32)}
  # The embedding job reads exactly these.
  np.testing.assert_array_equal(
      OpenCorpus(zebra_corpus).padded(16)['token_ids'],
      store.padded(16)['token_ids'])


def test_later_readers_map_the_store_and_a_changed_corpus_gets_a_new_one(
    zebra_corpus, tokenizer, tmp_path):
  block_store.open_store(zebra_corpus)
  written = sorted(p.name for p in tmp_path.joinpath('wiki_leads').iterdir()
                   if p.name.startswith(block_store.PREFIX))
  assert len(written) == 1 and '.incomplete' not in written[0]
  mapped = block_store.open_store(zebra_corpus)
  assert isinstance(mapped.arrays['token_ids'], np.memmap)
  assert mapped.title(3) == ARTICLES[3]['title']
  added = tmp_path / 'new.jsonl'
  added.write_text(json.dumps({'title': 'Quokka', 'text': 'A small '
                               'wallaby of Rottnest Island.'}) + '\n')
  corpus_changes.add_articles(zebra_corpus, tokenizer, [str(added)])
  changed = block_store.open_store(zebra_corpus)
  assert changed.num_blocks == 13 and changed.title(12) == 'Quokka'
  now = sorted(p.name for p in tmp_path.joinpath('wiki_leads').iterdir()
               if p.name.startswith(block_store.PREFIX))
  assert len(now) == 1 and now != written  # The stale store is gone.


def _spoil(path, damage: str) -> None:
  """Garbage, or one bit of the array's first element flipped: past the
  .npy header, in bytes the test reads, so that only the checksum can
  tell (unguarded, the flipped value would be read as it is)."""
  if damage == 'garbage':
    path.write_bytes(b'garbage')
  else:
    flip_a_bit(path, seed=1, byte=np.load(path, mmap_mode='r').offset)


@pytest.mark.parametrize('damage', ['garbage', 'a bit flipped'])
def test_a_damaged_store_is_read_again_from_the_shards(zebra_corpus,
                                                       tmp_path, damage):
  block_store.open_store(zebra_corpus)
  store_dir = next(p for p in tmp_path.joinpath('wiki_leads').iterdir()
                   if p.name.startswith(block_store.PREFIX))
  first_block = np.array(block_store.open_store(
      zebra_corpus).arrays['token_ids'][0])
  _spoil(store_dir / 'token_ids.npy', damage)
  store = block_store.open_store(zebra_corpus)
  assert store.title(0) == ARTICLES[0]['title']
  np.testing.assert_array_equal(store.arrays['token_ids'][0], first_block)
  assert isinstance(block_store.open_store(zebra_corpus).arrays['titles'],
                    np.memmap)  # Written afresh.


@pytest.mark.parametrize('damage', ['garbage', 'a bit flipped'])
def test_without_tensorflow_a_damaged_store_is_kept_and_named(
    zebra_corpus, tmp_path, monkeypatch, damage):
  """Where the shards cannot be read (no TensorFlow, as on a GPU machine),
  the store is the corpus's only copy: refused by name, never removed."""
  block_store.open_store(zebra_corpus)
  store_dir = next(p for p in tmp_path.joinpath('wiki_leads').iterdir()
                   if p.name.startswith(block_store.PREFIX))
  _spoil(store_dir / 'titles.npy', damage)

  def no_tensorflow():
    raise extras.MissingExtra('Reading corpus shards needs tensorflow.')
  monkeypatch.setattr(corpus, 'tensorflow', no_tensorflow)
  with pytest.raises(errors.BadInput, match=f'{store_dir} is unreadable'):
    block_store.open_store(zebra_corpus)
  assert (store_dir / 'bodies.npy').is_file()


def test_a_store_read_in_part_refuses_exactly_the_blocks_on_a_flipped_piece(
    zebra_corpus, tmp_path, monkeypatch):
  """`ask` and `search` open the store without reading it whole: a read
  checks the pieces it touches, so a flipped bit refuses the blocks whose
  bytes share its piece, by the file's name, and every other block reads."""
  monkeypatch.setattr(checksums, 'PIECE', 64)
  whole = block_store.open_store(zebra_corpus)  # Written, pieces of 64.
  bodies = [whole.body(i) for i in range(whole.num_blocks)]
  store_dir = next(p for p in tmp_path.joinpath('wiki_leads').iterdir()
                   if p.name.startswith(block_store.PREFIX))
  path = store_dir / 'bodies.npy'
  header = block_store.open_store(zebra_corpus).arrays['bodies'].offset
  offsets = whole.arrays['body_offsets']
  for seed in range(5):
    original = path.read_bytes()
    position = header * 8 + int(np.random.default_rng(seed).integers(
        (len(original) - header) * 8))
    flipped = bytearray(original)
    flipped[position // 8] ^= 1 << position % 8
    path.write_bytes(bytes(flipped))
    piece = position // 8 // 64
    store = block_store.open_store(zebra_corpus, whole=False)
    for i, body in enumerate(bodies):
      first, last = ((header + offsets[i]) // 64,
                     (header + offsets[i + 1] - 1) // 64)
      if first <= piece <= last:
        with pytest.raises(errors.ChecksumMismatch, match=f'{path}: CRC'):
          store.body(i)
      else:
        assert store.body(i) == body
    path.write_bytes(original)



def test_a_share_of_the_blocks_checks_its_own_and_a_damaged_one_is_rebuilt(
    zebra_corpus, tmp_path, monkeypatch):
  """The index builder's share, or the blocks a corpus sync adds, checks the
  pieces it reads; a flipped bit there reads the shards again."""
  monkeypatch.setattr(checksums, 'PIECE', 64)
  expected = OpenCorpus(zebra_corpus).padded(16)  # The store written.
  store_dir = next(p for p in tmp_path.joinpath('wiki_leads').iterdir()
                   if p.name.startswith(block_store.PREFIX))
  path = store_dir / 'token_ids.npy'
  ids = block_store.open_store(zebra_corpus).arrays['token_ids']
  offsets = block_store.open_store(zebra_corpus).arrays['token_offsets']
  last = ids.offset + ids.itemsize * int(offsets[-2])  # The last block's.
  assert (ids.offset + ids.itemsize * int(offsets[2])) // 64 < last // 64
  flipped = bytearray(path.read_bytes())
  flipped[last] ^= 1
  path.write_bytes(bytes(flipped))
  first_two = OpenCorpus(zebra_corpus).padded(16, 0, 2)
  for name, values in first_two.items():
    np.testing.assert_array_equal(values, expected[name][:2])
  assert path.read_bytes() == bytes(flipped)  # Not read, not rebuilt.
  last_two = OpenCorpus(zebra_corpus).padded(16, 10, 12)
  for name, values in last_two.items():
    np.testing.assert_array_equal(values, expected[name][10:])
  assert path.read_bytes() != bytes(flipped)  # Read again from the shards.
