"""Salient spans: entities from the tagger, dates from the pattern."""

import os

import pytest
import tensorflow as tf

from realm_jax.data import corpus, salient_spans


@pytest.mark.unit
@pytest.mark.parametrize('text,dates', [
    ('Apollo 11 landed on 20 July 1969.', ['20 July 1969']),
    ('It launched in July 1969 and returned July 24, 1969.',
     ['July 1969', 'July 24, 1969']),
    ('Founded in 1066; 12345 is no year, nor is 3000.', ['1066']),
])
def test_date_pattern(text, dates):
  assert [text[s:e] for s, e in salient_spans.date_spans(text)] == dates


@pytest.mark.unit
def test_overlapping_spans_keep_the_longer():
  spans = [(0, 4, 'DATE'), (0, 12, 'DATE'), (14, 20, 'PERSON'),
           (18, 25, 'ORG')]
  assert salient_spans.merge_spans(spans) == [(0, 12, 'DATE'),
                                              (18, 25, 'ORG')]


@pytest.fixture(scope='module')
def annotator(tokenizer):
  return salient_spans.SpanAnnotator(tokenizer, salient_spans.load_tagger(),
                                     max_query_length=24)


def _block(body, sentences):
  starts, ends, offset = [], [], 0
  for sentence in sentences:
    starts.append(offset)
    offset += len(sentence.encode())
    ends.append(offset)
    offset += 1
  assert ' '.join(sentences) == body
  return {'block_id': 0, 'title': 'T', 'body': body, 'sentence_starts': starts,
          'sentence_ends': ends}


@pytest.mark.unit
def test_a_known_sentence_gets_its_entity_and_date_spans(annotator):
  sentences = ['Neil Armstrong walked on the Moon on 20 July 1969.',
               'Café Müller is a ballet by Pina Bausch.']
  block = _block(' '.join(sentences), sentences)
  [(_, spans)] = list(annotator.annotate([block]))
  body = block['body'].encode()
  texts = {body[s:e].decode(): sentence for s, e, sentence in spans}
  assert texts['Neil Armstrong'] == 0 and texts['20 July 1969'] == 0
  assert texts['Pina Bausch'] == 1  # Offsets are bytes: é and ü count twice.


@pytest.mark.unit
def test_spans_past_the_query_budget_are_dropped_and_counted(annotator):
  sentence = ('The long preamble goes on' + ' and on' * 12 +
              ' until finally Neil Armstrong appears.')
  block = _block(sentence, [sentence])
  [(_, spans)] = list(annotator.annotate([block]))
  assert spans == []
  assert annotator.report.counts['span past the 24-wordpiece query'] == 1
  assert annotator.report.counts['block without a salient span'] == 1


@pytest.mark.unit
def test_held_out_spans_are_found_in_sibling_blocks_only():
  """A span counts when its words occur in another block of its article
  (whose title each block carries), never in its own or another article."""
  def block(title, body):
    return {'title': title, 'body': body}
  span = lambda body, text: (body.encode().index(text.encode()),
                             body.encode().index(text.encode())
                             + len(text.encode()), 0)
  first = 'Ada Lovelace wrote in 1843 about the Engine.'
  second = 'Babbage designed the Engine; Lovelace knew him.'
  counts = salient_spans.SiblingSpans()
  counts.add(block('Lovelace', first), [span(first, 'Ada Lovelace'),
                                        span(first, '1843'),
                                        span(first, 'Engine')], True)
  counts.add(block('Lovelace', second), [span(second, 'Babbage')], False)
  # The next article holds "1843", which is not a sibling of the first.
  third = 'In 1843 a ship sailed.'
  counts.add(block('Ship', third), [span(third, '1843')], True)
  assert counts.as_dict() == {
      'spans': 4, 'in_articles_of_several_blocks': 3,
      # "Engine" is in the sibling; "Ada Lovelace" is not (its title is
      # Lovelace alone); "1843" is elsewhere only.
      'in_a_sibling_block': 1, 'share_in_a_sibling_block': 0.25}


@pytest.mark.integration
def test_annotated_corpus(small_corpus):
  directory = os.path.join(small_corpus, 'wiki_leads')
  with open(os.path.join(directory, 'annotated', corpus.METADATA)) as f:
    stats = __import__('json').load(f)
  assert stats['num_blocks'] == corpus.load_metadata(directory)['num_blocks']
  assert 0.5 < stats['fraction_with_salient_span'] <= 1
  held = stats['held_out_spans']
  assert 0 <= held['in_a_sibling_block'] <= held[
      'in_articles_of_several_blocks'] <= held['spans'] > 0
  records = list(tf.data.TFRecordDataset(
      os.path.join(directory, 'annotated', 'train.tfrecord')).map(
          salient_spans.parse_annotated_block))
  assert len(records) == stats['splits']['train'] > 0
  for record in records:
    starts = record['sentence_starts'].numpy()
    ends = record['sentence_ends'].numpy()
    for s, e, i in zip(record['span_starts'].numpy(),
                       record['span_ends'].numpy(),
                       record['span_sentences'].numpy()):
      assert starts[i] <= s < e <= ends[i]
