"""`demo --preset=gpu`: the demo at accelerator size on one GPU, from a bundle
(`make bundle-gpu`; gin/setups/gpu_demo.gin): MiniLM-L6 at full depth for
every BERT, blocks of 128 wordpieces, 8 candidates, the 30x stale index.
Each run sees 100x the demo's queries (ICT 128,000, the reader 320,000,
pre-training 80,000, drawn from every salient span of the training blocks,
none twice before each once: `data.masked_queries`). Batch 128 of
pre-training ran out of an H100's 80 GB. About 9 minutes of stages on one
H100 by the stage times measured there on 2026-11-27 (docs/results/
gpu_stage_times_h100_2026-11-27.json, what the plan reads until a whole
run is recorded), against a budget of 8: launch/gpu_demo.sh's 9 minutes,
less its install and the bundle's check, shared among the stages."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki

ICT_STEPS, READER_STEPS, PRETRAIN_STEPS, REFRESH_INTERVAL = 500, 1250, 1250, 20
BATCH, PRETRAIN_BATCH = 256, 64
SETUP = 'gin/setups/gpu_demo.gin'
RUNS = {'realm': {}, 'baseline': {'Pretrain.num_candidates': 1},
        'stale': {'run_refresh.stale_factor': _wiki.STALE_FACTOR}}

PRESET = Preset(
    family='demo', setup=SETUP, run_gin=('gin/runs/eval.gin',),
    sizes={'ict_steps': ICT_STEPS, 'reader_steps': READER_STEPS,
           'pretrain_steps': PRETRAIN_STEPS,
           'refresh_interval': REFRESH_INTERVAL, 'finetune_steps': 0,
           'ablations': False, 'end_to_end': False, 'stale': True,
           'ict_batch': BATCH, 'reader_batch': BATCH,
           'pretrain_batch': PRETRAIN_BATCH},
    stages=(
        # corpus, machine, ict, recall_ict, reader;
        *_wiki.warm_starts(ICT_STEPS, READER_STEPS, BATCH),
        # pretrain_<run> for each run, throughput, masked_lm_<run> for each;
        *_wiki.pretraining(RUNS, PRETRAIN_STEPS, PRETRAIN_BATCH,
                           REFRESH_INTERVAL),
        _wiki.recall('recall_realm', 'realm'),
        _wiki.recall('recall_stale', 'stale')),
    comparisons=(('masked_lm', ('realm', 'baseline'), ('realm', 'stale')),
                 ('recall', ('realm', 'ict'), ('realm', 'stale'))),
    prepared=True, budget_minutes=8)
