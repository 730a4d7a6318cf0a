"""`demo --preset=gpu`: the demo at accelerator size on one GPU, from a bundle
(`make bundle-gpu`; gin/setups/gpu_demo.gin): MiniLM-L6 at full depth for
every BERT, blocks of 128 wordpieces, 8 candidates, the 30x stale index.
Each run sees 100x the demo's queries (ICT 128,000, the reader 320,000,
pre-training 80,000, drawn from every salient span of the training blocks,
none twice before each once: `data.masked_queries`).

Training stages run side by side, up to three at once, each in processes of
its own with its share of the GPU's memory: the ICT retriever beside the
warm reader, then REALM, its 30x stale run and the baseline together, while
this process scores each run as it ends. Their starts (compiling,
restoring, the first index) then overlap the others' steps, which share
the GPU. The budget is 8.5 minutes: launch/gpu_demo.sh's 9, less its
install, the bundle's check and the report (5 s on an H100), and the
stages' overrun of their shares (a checkpoint, the builder's last index);
the plan reads the newest record of the stage times measured on a GPU
(docs/results/gpu.json or gpu_stage_times*.json)."""

import dataclasses

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki

ICT_STEPS, READER_STEPS, PRETRAIN_STEPS, REFRESH_INTERVAL = 500, 1250, 1250, 20
BATCH, PRETRAIN_BATCH = 256, 64
SETUP = 'gin/setups/gpu_demo.gin'
BLOCK_LENGTH = 128  # SETUP's BLOCK_LENGTH: the bundle's corpus is cut so.
# REALM's step at batch 64 took 25.7 GiB beyond its arguments on an H100
# (2026-11-27), over its share below, and ran in 2 microbatches; since its
# LayerNorms and GELU are recomputed in the backward pass, XLA:GPU's
# compile for an H100 gives 13.5 GiB (`realm-jax aot --target=gpu:h100`;
# docs/benchmarks.md), inside the share: one microbatch. Were it not, the
# trainer would split the batch itself (`Trainer.fit_microbatches`).
RUNS = {'realm': {},
        'stale': {'run_refresh.stale_factor': _wiki.STALE_FACTOR},
        'baseline': {'Pretrain.num_candidates': 1}}
# Each training stage's share of the GPU's memory (its index builder's
# included), and this process's: the shares of the stages that run at once
# leave about 10% for the CUDA contexts of six processes.
MEMORY = {'ict': 0.3, 'reader': 0.3, 'pretrain_realm': 0.32,
          'pretrain_stale': 0.32, 'pretrain_baseline': 0.1}
SCORING_MEMORY = 0.12


def stages(ict_steps=ICT_STEPS, reader_steps=READER_STEPS,
           pretrain_steps=PRETRAIN_STEPS, refresh_interval=REFRESH_INTERVAL,
           batch=BATCH, pretrain_batch=PRETRAIN_BATCH):
  """The stages in the order the runner starts them, each with its share
  of the memory (other sizes: a smaller run of the same schedule)."""
  corpus, machine, ict, recall_ict, reader = _wiki.warm_starts(
      BLOCK_LENGTH, ict_steps, reader_steps, batch)
  pretraining = {stage.name: stage for stage in _wiki.pretraining(
      RUNS, pretrain_steps, pretrain_batch, refresh_interval)}
  order = (  # Each scored once its run is trained: the baseline first.
      'masked_lm_baseline', 'throughput', 'masked_lm_realm')
  # Pre-training starts once ICT and the reader are trained; ICT's recall
  # is scored while it compiles.
  stages = (corpus, machine, ict, reader,
            *(pretraining[f'pretrain_{name}'] for name in RUNS), recall_ict,
            *(pretraining[name] for name in order),
            _wiki.recall('recall_realm', 'realm'),
            pretraining['masked_lm_stale'],
            _wiki.recall('recall_stale', 'stale'))
  return tuple(dataclasses.replace(s, memory=MEMORY.get(s.name))
               for s in stages)


PRESET = Preset(
    family='demo', setup=SETUP, run_gin=('gin/runs/eval.gin',),
    sizes={'ict_steps': ICT_STEPS, 'reader_steps': READER_STEPS,
           'pretrain_steps': PRETRAIN_STEPS,
           'refresh_interval': REFRESH_INTERVAL, 'finetune_steps': 0,
           'ablations': False, 'end_to_end': False, 'stale': True,
           'ict_batch': BATCH, 'reader_batch': BATCH,
           'pretrain_batch': PRETRAIN_BATCH},
    stages=stages(),
    comparisons=(('masked_lm', ('realm', 'baseline'), ('realm', 'stale')),
                 ('recall', ('realm', 'ict'), ('realm', 'stale'))),
    prepared=True, budget_minutes=8.5, concurrent=3, memory=SCORING_MEMORY)
