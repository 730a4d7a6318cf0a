"""`realm-jax demo`: real retrieval over the embedded leads, cached embeddings."""

import pytest

from realm_jax import demo, main


@pytest.mark.slow
def test_demo_retrieves_the_right_leads_and_caches(tmp_path, capsys):
  questions = ['who wrote the novel about huckleberry finn?',
               'which stanley kubrick film features the computer hal 9000?',
               'who created the wonderland tale of alice?']
  args = ['demo', '--work_dir', str(tmp_path), '--max_docs', '40', '--top_k',
          '3', '--batch_size', '16']
  for question in questions:
    args += ['--question', question]
  assert main.main(args) == 0
  first = capsys.readouterr()
  assert 'embedded 40/40 (100%)' in first.err
  assert '1. [' in first.out and 'Adventures of Huckleberry Finn' in first.out

  retrieved = demo.run(str(tmp_path), questions, max_docs=40, top_k=3,
                       batch_size=16)
  assert 'Reusing document embeddings' in capsys.readouterr().out
  assert [titles[0] for titles in retrieved] == [
      'Adventures of Huckleberry Finn', '2001: A Space Odyssey',
      "Alice's Adventures in Wonderland"]
  # Changing the corpus invalidates the cache.
  demo.run(str(tmp_path), questions[:1], max_docs=20, top_k=3, batch_size=16)
  assert 'Reusing' not in capsys.readouterr().out
