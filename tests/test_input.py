"""The input layer: the source is chosen once, from gin, where a run is
loaded, and handed to everything that reads the run's examples."""

import gin
import pytest
import seqio

from realm_jax import errors
from realm_jax.input import configured
from realm_jax.input.arrays import ArraysSource
from realm_jax.input.seqio_source import SeqioSource
from realm_jax.input.source import Source
from realm_jax.training import run_loader

pytestmark = pytest.mark.unit

TRAIN = ['gin/runs/finetune.gin', 'gin/models/tiny.gin']


def test_gin_names_the_source_and_an_unknown_one_is_refused():
  assert isinstance(configured.configured_source(), SeqioSource)
  gin.bind_parameter('Examples.source', 'arrays')
  gin.bind_parameter('Examples.arrays_dir', '/a')
  chosen = configured.configured_source()
  assert isinstance(chosen, ArraysSource) and chosen.root == '/a'
  with pytest.raises(errors.BadConfig, match="Examples.source='parquet'"):
    configured.configured_source(source='parquet')


def test_both_sources_answer_the_whole_interface():
  for source in (SeqioSource(), ArraysSource()):
    assert isinstance(source, Source)
    assert not getattr(source, '__abstractmethods__', None)
  assert SeqioSource().position('t', 4) == {'data_shards': 4}


def test_a_loaded_run_carries_the_source_its_config_names(tmp_path):
  run_loader.configure(TRAIN, ["Examples.source = 'arrays'",
                               "Examples.arrays_dir = '/a'"])
  configured_run = run_loader.configured_run()
  assert isinstance(configured_run.source, ArraysSource)
  assert configured_run.source.root == '/a'
  # Whatever the run reads, its splits are exported through seqio.
  assert isinstance(configured_run.exporter(), SeqioSource)


def test_a_qa_file_run_read_through_seqio_has_its_task_registered(tmp_path):
  path = tmp_path / 'trivia.tsv'
  path.write_text("who wrote hamlet?\t['Shakespeare']\n")
  run_loader.configure(TRAIN, [f"Finetune.qa_file = '{path}'"])
  configured_run = run_loader.configured_run()
  assert configured_run.run.task in seqio.TaskRegistry.names()
  other = tmp_path / 'other.tsv'
  other.write_text("who painted guernica?\t['Picasso']\n")
  run_loader.configure(TRAIN, [f"Finetune.qa_file = '{other}'",
                               "Examples.source = 'arrays'"])
  arrays_run = run_loader.configured_run()  # Exported under its name.
  assert arrays_run.run.task not in seqio.TaskRegistry.names()
