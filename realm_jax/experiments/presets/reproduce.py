"""`make reproduce`: the paper's Table 2 rows in miniature (meant for at
most 90 minutes on 2 cores; its record's time is in docs/RESULTS.md): the
demo's checks, the 30x stale index and random-span masking (each
pre-trained as REALM is), and NQ fine-tuning from REALM and from ORQA
(the ICT retriever with a BERT reader), scored on NQ,
WebQuestions and CuratedTREC."""

from realm_jax.experiments.preset import Dir, Preset
from realm_jax.experiments.presets import _wiki, demo

ICT_STEPS, READER_STEPS, PRETRAIN_STEPS, REFRESH_INTERVAL = 100, 300, 300, 20
FINETUNE_STEPS, BATCH, PRETRAIN_BATCH = 200, 32, 8
RUNS = {'realm': {}, 'baseline': {'Pretrain.num_candidates': 1},
        'stale': {'run_refresh.stale_factor': _wiki.STALE_FACTOR},
        'random_span': {'Pretrain.masking': 'random_span'}}
RECALLED = ('realm', 'stale', 'random_span')

PRESET = Preset(
    family='demo', setup=demo.PRESET.setup, run_gin=('gin/runs/eval.gin',),
    sizes={'ict_steps': ICT_STEPS, 'reader_steps': READER_STEPS,
           'pretrain_steps': PRETRAIN_STEPS,
           'refresh_interval': REFRESH_INTERVAL,
           'finetune_steps': FINETUNE_STEPS, 'ablations': True,
           'end_to_end': False, 'stale': False,
           'ict_batch': BATCH, 'reader_batch': BATCH,
           'pretrain_batch': PRETRAIN_BATCH},
    stages=(
        # corpus, machine, ict, recall_ict, reader;
        *_wiki.warm_starts(demo.BLOCK_LENGTH, ICT_STEPS, READER_STEPS,
                           BATCH),
        # pretrain_<run> for each run, throughput, masked_lm_<run> for each;
        *_wiki.pretraining(RUNS, PRETRAIN_STEPS, PRETRAIN_BATCH,
                           REFRESH_INTERVAL),
        *(_wiki.recall(f'recall_{name}', name) for name in RECALLED),
        _wiki.finetune('realm', FINETUNE_STEPS,
                       {'Finetune.pretrain_model_dir': Dir('realm')},
                       keep=False),
        _wiki.qa('realm'),
        _wiki.finetune('orqa', FINETUNE_STEPS,
                       {'Finetune.ict_model_dir': Dir('ict')}, keep=False),
        _wiki.qa('orqa')),
    comparisons=(
        ('masked_lm', *(('realm', name) for name in RUNS if name != 'realm')),
        ('recall', ('realm', 'ict'), ('realm', 'stale'),
         ('realm', 'random_span')),
        ('em', 'qa_realm', 'qa_orqa')))
