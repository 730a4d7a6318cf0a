"""The command line's error path, `search` and `--version`.

Every subcommand is given bad input the way a user would; each must end in
a line or two that names the problem, with exit code 2 and no traceback.
"""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

import gin
import numpy as np
import pytest

from realm_jax import errors, main, quiet
from realm_jax.evaluation.answers import BlockTexts
from tests.helpers import REPO, finetuned, run_cli, unchanged, zebra_data


@pytest.fixture(scope='module')
def finetuned_run(tmp_path_factory, tokenizer):
  """A tiny 2-step fine-tuning run over the zebra corpus, its environment."""
  root = tmp_path_factory.mktemp('zebra')
  env = zebra_data(root, tokenizer)
  with pytest.MonkeyPatch.context() as patch:
    for name, value in env.items():
      patch.setenv(name, value)
    model_dir = finetuned(root)
  gin.clear_config()  # Set up between tests: leaves no config behind.
  for shared in unchanged(model_dir, 'run'):
    yield shared, env


@pytest.fixture
def places(finetuned_run, trained_pretraining, small_corpus, tmp_path,
           monkeypatch):
  """What the bad invocations name: the two runs, a missing path, a file,
  a QA file of no known format; the zebra environment is set."""
  finetune, env = finetuned_run
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  # `aot` fakes its devices through the environment of the process.
  for name in ('XLA_FLAGS', 'JAX_PLATFORMS'):
    if name in os.environ:
      monkeypatch.setenv(name, os.environ[name])
    else:
      monkeypatch.delenv(name, raising=False)
  (tmp_path / 'file.txt').write_text('a file\n')
  (tmp_path / 'notes.txt').write_text('just some notes\n')
  (tmp_path / 'empty').mkdir()
  # A run that wrote its config and no checkpoint yet.
  unstarted = tmp_path / 'unstarted'
  unstarted.mkdir()
  shutil.copy(os.path.join(trained_pretraining, 'config.gin'), unstarted)
  return {'finetune': finetune, 'pretrain': trained_pretraining,
          'unstarted': str(unstarted), 'small_corpus': small_corpus, 'missing': str(tmp_path / 'missing'),
          'file': str(tmp_path / 'file.txt'),
          'notes': str(tmp_path / 'notes.txt'),
          'empty': str(tmp_path / 'empty'), 'tmp': str(tmp_path)}


# (command line, what the message must say[, the corpus directory the run
# needs, when not the zebra's]); {names} are `places`.
BAD_INVOCATIONS = [
    (['demo', '--work_dir={file}'], 'is a file'),
    (['demo', '--lockstep'], '--lockstep is for the world presets'),
    (['demo', '--preset=world', '--repeats=0'], "argument --repeats: '0': give a whole number above 0"),
    (['data', 'build-corpus', '--jsonl={missing}', '--output_dir={tmp}/c'],
     'No JSONL file of articles {missing}'),
    (['data', 'annotate', '--corpus_dir={missing}'], 'No corpus at {missing}'),
    (['embed', '--model_dir={empty}'],
     '{empty} is not a realm-jax training run'),
    (['embed', '--model_dir={unstarted}'],
     'No trainer checkpoint in {unstarted}', 'small_corpus'),
    (['embed', '--gin_file=gin/models/nope.gin'], 'nope.gin'),
    (['train', '--model_dir={tmp}/t', '--gin_file=gin/runs/nope.gin'],
     'nope.gin'),
    (['train', '--model_dir={tmp}/t', '--gin_file=gin/models/tiny.gin'],
     'binds no train.run'),
    (['train', '--model_dir={tmp}/t', '--gin_file=gin/runs/ict.gin',
      '--gin_file=gin/models/tiny.gin', '--gin.train.num_stepz=2'],
     'num_stepz'),
    (['fill', 'no mask here', '--model_dir={pretrain}'], 'No [MASK] in',
     'small_corpus'),
    (['fill', 'The [MASK] is striped.', '--model_dir={finetune}'],
     'is a fine-tuning run (Finetune)'),
    (['fill', '--texts={missing}', '--model_dir={pretrain}'],
     'No file of inputs {missing}'),
    (['fill', 'The [MASK] is red.', '--model_dir={missing}'],
     '{missing} is not a realm-jax training run'),
    (['eval', '--model_dir={finetune}'], 'Give a --task or a --qa_file'),
    (['eval', '--model_dir={finetune}', '--qa_file={notes}'],
     '{notes}:1: not an Open-QA row'),
    (['eval', '--model_dir={missing}', '--task=nq_open'],
     'is not a realm-jax training run'),
    (['eval', '--model_dir={finetune}', '--task=nq_opn'], 'invalid choice'),
    (['ask', 'who?', '--model_dir={missing}'],
     '{missing} is not a realm-jax training run'),
    (['ask', 'who?', '--model_dir={pretrain}'],
     'is a pre-training run (Pretrain)'),
    (['ask', ' ', '--model_dir={finetune}'], 'the text given is empty'),
    (['ask', '--questions={empty}', '--model_dir={finetune}'],
     'it is a directory'),
    (['search', 'zebra', '--model_dir={missing}'],
     'is not a realm-jax training run'),
    (['search', 'zebra', '--model_dir={finetune}', '--top_k=0'],
     '--top_k 0: give 1 or more'),
    (['refresh', '--model_dir={tmp}/r', '--corpus_dir={missing}'],
     'No corpus at {missing}'),
    (['aot', '--mesh=1', '--model_dir={missing}'],
     'is not a realm-jax training run'),
    (['import', '--model_dir={pretrain}', '--source={file}',
      '--blocks={file}'], 'exists; import writes a new run'),
    (['import', '--model_dir={tmp}/i', '--export={empty}'],
     'holds no manifest.json: not a realm-jax export'),
    (['import', '--model_dir={tmp}/i', '--export={empty}', '--source={file}'],
     'give it without --source.'),
    (['import', '--model_dir={tmp}/i', '--export={empty}', '--benchmark=x',
      '--gin.foo=1'], 'give it without --benchmark, --gin_bindings.'),
    (['export', '--model_dir={missing}', '--output={tmp}/e'],
     'is not a realm-jax training run'),
    (['export', '--model_dir={pretrain}', '--output={file}'],
     'Cannot write --output {file}: it is a file.'),
    (['corpus', 'add', '--model_dir={finetune}'], 'Give --jsonl=FILE'),
    (['corpus', 'sync', '--model_dir={missing}', '--jsonl={file}'],
     'corpus sync reads no --jsonl.'),
    (['corpus', 'remove', '--model_dir={missing}', '--jsonl={file}'],
     'corpus remove reads no --jsonl.'),
    (['corpus', 'remove', '--model_dir={missing}', '--titles={file}'],
     'is not a realm-jax training run'),
    (['nope'], 'invalid choice'),
]


@pytest.mark.integration
@pytest.mark.parametrize('argv,message,corpora', [
    (*case, None)[:3] for case in BAD_INVOCATIONS],
                         ids=[' '.join(c[0][:2]) for c in BAD_INVOCATIONS])
def test_a_user_error_is_one_message_and_exit_code_2(argv, message, corpora,
                                                     places, capsys,
                                                     monkeypatch):
  if corpora:
    monkeypatch.setenv('REALM_CORPUS_DIR', places[corpora])
  code, printed = run_cli([a.format(**places) for a in argv], capsys)
  assert code == 2, printed
  assert message.format(**places) in printed
  assert 'Traceback' not in printed
  if argv[0] != 'nope' and 'invalid choice' not in message:
    last = printed.rstrip().splitlines()[-2:]  # The message, and its hint.
    assert any(f'realm-jax {argv[0]}: ' in line for line in last), printed


@pytest.mark.unit
def test_every_subcommand_has_a_bad_invocation():
  commands = main._parser()._subparsers._group_actions[0].choices
  assert set(commands) == set(main.COMMANDS)
  assert set(commands) <= {case[0][0] for case in BAD_INVOCATIONS}


@pytest.mark.integration
def test_the_wrong_run_kind_is_read_from_the_run_not_from_a_failure(
    places, capsys, monkeypatch):
  """An index that does not fit the corpus is a failure further down;
  `ask` on a pre-training run is refused before it could reach one."""
  monkeypatch.setenv('REALM_CORPUS_DIR', places['tmp'])  # No corpus here.
  code, printed = run_cli(['ask', 'who?', f'--model_dir={places["pretrain"]}'],
                       capsys)
  assert code == 2 and 'realm-jax fill' in printed
  assert 'realm-jax search' in printed and 'corpus' not in printed
  # The mismatch itself, on a run that can answer: its index embeds the
  # zebra corpus, not the small one.
  monkeypatch.setenv('REALM_CORPUS_DIR', places['small_corpus'])
  code, printed = run_cli(['ask', 'who?', f'--model_dir={places["finetune"]}'],
                       capsys)
  assert code == 2 and 'does not match' in printed
  assert 'Traceback' not in printed


@pytest.mark.unit
def test_a_bug_keeps_its_traceback_and_debug_shows_a_user_errors(
    monkeypatch, capsys):
  def broken(args):
    del args
    raise KeyError('a bug')

  monkeypatch.setitem(main.COMMANDS, 'search', broken)
  with pytest.raises(KeyError, match='a bug'):
    main.main(['search', 'x', '--model_dir=y'])

  def refused(args):
    del args
    raise errors.BadInput('Bad thing.', 'Do this instead.')

  monkeypatch.setitem(main.COMMANDS, 'search', refused)
  assert main.main(['search', 'x', '--model_dir=y']) == 2
  err = capsys.readouterr().err
  assert err == 'realm-jax search: Bad thing.\nDo this instead.\n'
  for argv, env in ((['--debug', 'search', 'x', '--model_dir=y'], '0'),
                    (['search', 'x', '--model_dir=y', '--debug'], '0'),
                    (['search', 'x', '--model_dir=y'], '1')):
    monkeypatch.setenv(main.DEBUG_ENV, env)
    assert main.main(argv) == 2
    err = capsys.readouterr().err
    assert 'Traceback' in err and err.endswith(
        'realm-jax search: Bad thing.\nDo this instead.\n')


@pytest.mark.unit
def test_every_command_that_compiles_starts_the_compilation_cache(
    monkeypatch):
  started = []
  monkeypatch.setattr(main, 'use_compilation_cache',
                      lambda: started.append(True))
  for command, argv in (('train', ['train', '--model_dir=x',
                                   '--gin_file=gin/runs/ict.gin']),
                        ('search', ['search', 'x', '--model_dir=y']),
                        ('aot', ['aot', '--mesh=8'])):
    monkeypatch.setitem(main.COMMANDS, command, lambda args: None)
    started.clear()
    assert main.main(argv) == 0
    assert started == ([] if command in main.UNCACHED else [True]), command
  monkeypatch.undo()
  monkeypatch.setenv(main.CACHE_ENV, 'off')
  assert main.use_compilation_cache() is None


# A process compiling one function (longer than a trivial one takes, so
# that any minimum compile time is passed); it prints how many programs it
# read from the cache.
COMPILE_ONE = (
    'import jax, jax.numpy as jnp\n'
    'from realm_jax import main\n'
    'hits = []\n'
    'jax.monitoring.register_event_listener(lambda event, **_: hits.append('
    'event) if event == "/jax/compilation_cache/cache_hits" else None)\n'
    'print(main.use_compilation_cache())\n'
    'step = jax.jit(lambda x: jnp.tanh(jnp.sin(x) @ x.T).sum(0))\n'
    'step(jnp.ones((16, 16))).block_until_ready()\n'
    'print(len(hits))\n')


@pytest.mark.integration
def test_a_second_process_reads_what_the_first_compiled(tmp_path):
  """What one process (the trainer) compiled, the next one (the index
  builder, the demo's next training, a resumed run) reads from the cache."""
  cache = tmp_path / 'xla'

  def hits(directory):
    done = subprocess.run(
        [sys.executable, '-c', COMPILE_ONE], cwd=REPO, capture_output=True,
        text=True, check=True, env={**os.environ, main.CACHE_ENV: directory})
    where, count = done.stdout.split()
    assert where == directory
    return int(count)

  assert hits(str(cache)) == 0
  assert any(cache.iterdir())
  assert hits(str(cache)) >= 1


@pytest.mark.integration
def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
  """The real process: Python would print a traceback and exit 1 if the
  error escaped."""
  missing = str(tmp_path / 'missing')
  done = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'ask', 'who wrote hamlet?',
       f'--model_dir={missing}'], cwd=REPO, capture_output=True, text=True,
      check=False, env={**os.environ, main.DEBUG_ENV: ''})
  assert done.returncode == 2, done.stderr
  assert 'Traceback' not in done.stderr
  assert done.stderr.strip().splitlines()[-2] == (
      f'realm-jax ask: {missing} is not a realm-jax training run: it has no '
      'config.gin.')


# Each kind of user error a command meets before it does any work: its
# arguments (`{run}`: a new run directory) and the message, every line of
# what it prints. The bad source is refused after the trainer took its lock
# and opened its checkpoint manager, whose clean-up runs in the background.
EARLY_ERRORS = {
    'bad gin': (
        ['train', '--model_dir={run}', '--gin_file=gin/runs/ict.gin',
         '--gin.train.num_steps=zz'],
        ["realm-jax train: gin binding 'train.num_steps = zz': malformed "
         "node or string on line 1: Failed to parse token 'zz' (line 1)"]),
    'bad source': (
        ['train', '--model_dir={run}', '--gin_file=gin/runs/ict.gin',
         '--gin_file=gin/models/tiny.gin', "--gin.Examples.source='parquet'"],
        ["realm-jax train: Examples.source='parquet'; expected one of "
         "('seqio', 'arrays')."]),
    'missing file': (
        ['train', '--model_dir={run}', '--gin_file=gin/runs/nope.gin'],
        ['realm-jax train: gin: Unable to open file: gin/runs/nope.gin. '
         f"Searched config paths: ['', {str(REPO)!r}].",
         'Check the --gin_file paths (from here or the repository root) and '
         'the names bound in them.']),
    'wrong run kind': (
        ['fill', 'a [MASK] b', '--model_dir={ict}'],
        ["realm-jax fill: This command fills [MASK]s with a pre-training "
         "run's reader (Pretrain); {ict} is an ICT run (a retriever without "
         "a reader) (Ict).",
         '`realm-jax ask` answers questions with a fine-tuning run; '
         '`realm-jax search` shows what any run retrieves.']),
}


@pytest.mark.integration
@pytest.mark.slow
def test_every_kind_of_early_user_error_exits_clean_ten_times(tmp_path):
  """Its message is the whole output, every time, and a run directory the
  command made is removed, lock and all, so the corrected command starts
  fresh. Before Orbax's clean-up of temporary paths was awaited when the
  manager is made (`run_directory.settled`), 8 of 12 runs of the bad source
  on 2 busy cores printed its traceback after the message, the interpreter
  shutting down under it."""
  ict = tmp_path / 'ict'  # A run directory as `fill` reads its kind.
  ict.mkdir()
  (ict / 'config.gin').write_text("include 'gin/runs/ict.gin'\n"
                                  "include 'gin/models/tiny.gin'\n")

  def attempt(kind_and_number):
    kind, number = kind_and_number
    run = tmp_path / f'{kind}_{number}'.replace(' ', '_')
    argv, _ = EARLY_ERRORS[kind]
    done = subprocess.run(
        [sys.executable, '-m', 'realm_jax.main',
         *(a.format(run=run, ict=ict) for a in argv)],
        cwd=REPO, capture_output=True, text=True, check=False,
        env={**os.environ, main.DEBUG_ENV: ''})
    return kind, run, done

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for kind, run, done in pool.map(attempt, [
        (kind, n) for kind in EARLY_ERRORS for n in range(10)]):
      expected = [line.replace('{ict}', str(ict))
                  for line in EARLY_ERRORS[kind][1]]
      assert (done.returncode, done.stdout) == (2, ''), (kind, done.stderr)
      assert done.stderr.splitlines() == expected, (kind, done.stderr)
      assert not run.exists(), kind
  # A run directory that was there before is left as it was.
  kept = tmp_path / 'kept'
  kept.mkdir()
  (kept / 'notes.txt').write_text('mine')
  subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'train', f'--model_dir={kept}',
       '--gin_file=gin/runs/ict.gin', '--gin_file=gin/models/tiny.gin',
       "--gin.Examples.source='parquet'"], cwd=REPO, check=False,
      capture_output=True)
  assert (kept / 'notes.txt').read_text() == 'mine'


@pytest.mark.unit
def test_version_names_the_packages_and_the_devices(capsys):
  with pytest.raises(SystemExit) as exit_:
    main.main(['--version'])
  assert exit_.value.code == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == 'realm-jax 0.1.0'
  assert [line.split()[0] for line in lines[:-1]] == list(main.PACKAGES)
  assert lines[-1].startswith('devices: ') and 'cpu' in lines[-1].lower()


def _softmax(scores):
  p = np.exp(np.asarray(scores, np.float64) - max(scores))
  return p / p.sum()


@pytest.mark.integration
def test_search_shows_the_top_blocks_of_a_fine_tuning_and_a_pretraining_run(
    places, capsys, monkeypatch, tmp_path, tokenizer):
  output = tmp_path / 'found.jsonl'
  code, printed = run_cli(['search', 'black and white stripes',
                        f'--model_dir={places["finetune"]}', '--top_k=3',
                        f'--output={output}'], capsys)
  assert code == 0, printed
  row = json.loads(output.read_text())
  assert row['kind'] == 'Finetune' and row['index_step'] == 0
  blocks = row['blocks']
  assert len(blocks) == 3
  scores = [b['score'] for b in blocks]
  assert scores == sorted(scores, reverse=True)
  np.testing.assert_allclose([b['p_z'] for b in blocks], _softmax(scores),
                             rtol=1e-6)
  titles = BlockTexts(os.path.join(os.environ['REALM_CORPUS_DIR'],
                                  'wiki_leads'), tokenizer).titles
  assert [b['title'] for b in blocks] == [titles[b['block_id']]
                                          for b in blocks]
  for block in blocks:
    assert f'{block["title"]}: {block["text"]}' in printed
  # A pre-training run, many queries from a file: the index of its own
  # step, embedded now (into a copy: the run is shared).
  pretrain = shutil.copytree(places['pretrain'], str(tmp_path / 'pretrain'))
  monkeypatch.setenv('REALM_CORPUS_DIR', places['small_corpus'])
  queries = tmp_path / 'queries.txt'
  queries.write_text('the capital of France\n\nan English poet\n')
  code, printed = run_cli(['search', f'--queries={queries}',
                        f'--model_dir={pretrain}'], capsys)
  assert code == 0, printed
  assert printed.count('(Pretrain step 2, index step 2)') == 2
  assert printed.count('p(z|x)') == 2


@pytest.mark.integration
def test_search_in_a_fresh_process_keeps_what_it_compiled(places, tmp_path):
  cache = tmp_path / 'xla'
  done = subprocess.run(
      [sys.executable, '-m', 'realm_jax.main', 'search', 'zebra stripes',
       f'--model_dir={places["finetune"]}'], cwd=REPO, capture_output=True,
      text=True, check=False, env={**os.environ, main.CACHE_ENV: str(cache)})
  assert done.returncode == 0, done.stderr
  assert 'Animal ' in done.stdout or 'Crossings' in done.stdout
  assert any(cache.iterdir())  # The next `search` reads it.


# Lines of the libraries' set-up chatter: TensorFlow's C++ log (a timestamp,
# then I, W or E), seqio's notices and Orbax's read-only ones.
SET_UP_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] |oneDNN|cuInit|"
    r"uncached FunctionDataset|Given sequence lengths|'logger_cls' is empty|"
    r'CheckpointManagerOptions\.read_only=True|Given directory is read only')


@pytest.mark.integration
@pytest.mark.slow
def test_a_command_shows_the_libraries_set_up_lines_only_when_verbose(
    finetuned_run, tmp_path):
  """`eval` opens its run's checkpoints and index read-only (Orbax) and
  reads its task's questions through seqio, over TensorFlow."""
  model_dir, data = finetuned_run
  env = {name: value for name, value in {**os.environ, **data}.items()
         if name not in (quiet.VERBOSE_ENV, quiet.TF_LOG_ENV)}
  err = {}
  for flags in ([], ['--verbose']):
    done = subprocess.run(
        [sys.executable, '-m', 'realm_jax.main', 'eval', '--task=nq_open',
         f'--model_dir={model_dir}', f'--output_dir={tmp_path}/eval',
         *flags], cwd=REPO, capture_output=True, text=True, check=False,
        env=env)
    assert done.returncode == 0, done.stderr
    assert 'nq_open (Finetune step 2' in done.stdout
    assert 'eval nq_open 4/4' in done.stderr  # Its own progress line.
    err[bool(flags)] = done.stderr.splitlines()
  assert not [line for line in err[False] if SET_UP_LINE.search(line)]
  verbose = '\n'.join(err[True])
  for shown in ('CheckpointManagerOptions.read_only=True',
                'Given directory is read only'):
    assert shown in verbose, verbose
