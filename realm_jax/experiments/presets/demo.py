"""`make demo`: REALM's two core checks in miniature on the embedded default
(the 10k Wikipedia leads, MiniLM), about 20 minutes on 2 cores: held-out
masked accuracy against the trained no-retrieval baseline, and NQ recall
against the ICT start."""

from realm_jax.experiments.preset import Preset
from realm_jax.experiments.presets import _wiki

# The corpus is cut at the length its setup's runs read (BLOCK_LENGTH).
BLOCK_LENGTH = 64
ICT_STEPS, READER_STEPS, PRETRAIN_STEPS, REFRESH_INTERVAL = 40, 100, 100, 10
BATCH, PRETRAIN_BATCH = 32, 8
RUNS = {'realm': {}, 'baseline': {'Pretrain.num_candidates': 1}}

PRESET = Preset(
    family='demo', setup='gin/setups/demo.gin', run_gin=('gin/runs/eval.gin',),
    sizes={'ict_steps': ICT_STEPS, 'reader_steps': READER_STEPS,
           'pretrain_steps': PRETRAIN_STEPS,
           'refresh_interval': REFRESH_INTERVAL, 'finetune_steps': 0,
           'ablations': False, 'end_to_end': False, 'stale': False,
           'ict_batch': BATCH, 'reader_batch': BATCH,
           'pretrain_batch': PRETRAIN_BATCH},
    stages=(
        # corpus, machine, ict, recall_ict, reader;
        *_wiki.warm_starts(BLOCK_LENGTH, ICT_STEPS, READER_STEPS, BATCH),
        # pretrain_realm, pretrain_baseline, throughput, masked_lm_realm,
        # masked_lm_baseline;
        *_wiki.pretraining(RUNS, PRETRAIN_STEPS, PRETRAIN_BATCH,
                           REFRESH_INTERVAL),
        _wiki.recall('recall_realm', 'realm')),
    comparisons=(('masked_lm', ('realm', 'baseline')),
                 ('recall', ('realm', 'ict'))))
