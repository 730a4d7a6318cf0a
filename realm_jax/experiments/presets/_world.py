"""The stages the controlled world's presets are made of (`world` family):
the world written, the two warm starts, REALM and its controls, each
scored on the same held-out queries, and the edit check."""

import dataclasses

from realm_jax.data import world
from realm_jax.experiments.preset import Dir, Preset, Stage

CORPUS = 'world'
STALE_FACTOR = 30
# REALM and the stale run are also scored at each quarter of their training:
# a stale run recovers from its stale index within a few dozen steps of its
# one refresh, by a margin that varies from seed to seed, so its last step
# alone says little of what the staleness cost (docs/levers.md).
ALONG = 4
# The reader's warm start copies only after a plateau whose length is the
# seed's: at 2e-3, seeds 0 and 2 copied every value by step 300 and seed 1
# 38% at step 500, so that its REALM read nothing (docs/levers.md).
READER_LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The steps of each stage; other settings are gin's (world.gin)."""
  ict_steps: int
  reader_steps: int
  pretrain_steps: int
  refresh_interval: int
  batch_size: int = 16
  # REALM's candidates, the null document included (the paper's 8; the
  # top 3 of the first world runs left the retriever one query template
  # of two in most runs: docs/RESULTS.md).
  candidates: int = 8
  # REALM's warmup: over 30 steps the towers of some seeds flattened p(z|x)
  # within 50 steps and never came back (docs/levers.md).
  warmup_steps: int = 30
  ablations: bool = True  # The stale run and the edit check.
  eval_every: int = 25  # Held-out recall@1 and accuracy while training.


def realm(name: str, sizes: Sizes, stale_factor: int | None = 1,
          **bindings) -> Stage:
  """REALM from the two warm starts (`bindings`: the controls). With a
  `stale_factor`, the index builder beside the trainer re-embeds a
  checkpoint every `refresh_interval` x `stale_factor` steps (asynchronous,
  or on a fixed schedule with `--lockstep`); None: no builder."""
  interval = sizes.refresh_interval
  cadence = {'run_refresh.refresh_interval_steps': interval}
  builder = (None if stale_factor is None else
             {**cadence, 'run_refresh.stale_factor': stale_factor})
  # The builder embeds the towers alone, saved every interval; whole
  # checkpoints at the quarters (those scored along the run). Without it,
  # the last alone: a whole checkpoint every 5 steps cost the frozen
  # control a sixth of its stage (docs/levers.md).
  saves = ({'train.retriever_every': interval,
            'train.checkpoint_every': sizes.pretrain_steps // ALONG}
           if builder else {'train.checkpoint_every': sizes.pretrain_steps})
  return Stage(f'pretrain_{name}', 'realm', {'run_dir': name, 'bindings': {
      'train.num_steps': sizes.pretrain_steps,
      'train.batch_size': sizes.batch_size, 'train.log_every': 1,
      'Pretrain.ict_model_dir': Dir('ict'),
      'Pretrain.reader_model_dir': Dir('reader'),
      **saves, **cadence,
      'train.eval_every': sizes.eval_every, 'train.eval_batches': 8,
      'Pretrain.num_candidates': sizes.candidates,
      'bert_adamw.warmup_steps': sizes.warmup_steps, **bindings},
      'builder': builder})


def preset(spec: world.WorldSpec, sizes: Sizes,
           signal: str = 'marginal') -> Preset:
  """The world's stages at `sizes`: REALM, the trained baseline, the frozen
  towers' control and the start, each scored on the held-out queries
  (with the ablations: the 30x stale index, and the edit check). `signal`
  trains the retriever of every run (`run_kinds.retriever_signal`; the
  runs that read the null document alone do not use it)."""
  along = sizes.pretrain_steps // ALONG
  if not along or along * ALONG != sizes.pretrain_steps or (
      along % sizes.refresh_interval):
    raise ValueError(f'pretrain_steps={sizes.pretrain_steps} must be a '
                     f'positive multiple of {ALONG} x the checkpoints\' '
                     f'refresh_interval={sizes.refresh_interval}: REALM is '
                     'scored at each quarter of its training.')
  trains = ({} if signal == 'marginal' else
            {'retriever_signal.name': signal})
  kept, kept_runs = ({'train.keep_every': along, **trains},
                     ('realm', 'stale'))
  runs = {'realm': realm('realm', sizes, **kept),
          'baseline': realm('baseline', sizes, None,
                            **{'Pretrain.num_candidates': 1}),
          'frozen': realm('frozen', sizes, None, **trains,
                          **{'Pretrain.train_retriever': False}),
          # Scored as the others are, on the same queries: where they began.
          'start': realm('start', sizes, None, **{
              'train.num_steps': 0, 'bert_adamw.warmup_steps': 0})}
  if sizes.ablations:
    runs['stale'] = realm('stale', sizes, STALE_FACTOR, **kept)
  return Preset(
      family='world', setup='gin/setups/world.gin',
      sizes=dataclasses.asdict(sizes),
      stages=(
          Stage('world', 'world', {'spec': dataclasses.asdict(spec)}),
          Stage('machine', 'machine', timed=False),
          Stage('ict', 'train', {'run': 'ict', 'bindings': {
              'train.num_steps': sizes.ict_steps,
              'train.checkpoint_every': sizes.ict_steps,
              'train.batch_size': 64, 'bert_adamw.learning_rate': 2e-3,
              'bert_adamw.warmup_steps': max(sizes.ict_steps // 10, 1)}},
                result=''),
          Stage('reader', 'train', {'run': 'pretrain', 'bindings': {
              'train.num_steps': sizes.reader_steps,
              'train.checkpoint_every': sizes.reader_steps,
              'train.batch_size': 32, 'Pretrain.num_candidates': 1,
              'Pretrain.source_block_rate': 1.0,
              'bert_adamw.learning_rate': READER_LEARNING_RATE}},
                result=''),
          *runs.values(),
          *(Stage(f'score_{name}', 'score', {
              'run_dir': name, **({'along': along} if name in kept_runs
                                  else {})},
                  result=f'held_out/{name}') for name in runs),
          Stage('score_no_document', 'score',
                {'run_dir': 'realm', 'name': 'no_document',
                 'task': world.no_document_task(CORPUS)},
                result='no_document'),
          *([Stage('edit', 'edit', {'run_dir': 'realm'})] if sizes.ablations
            else ())))
