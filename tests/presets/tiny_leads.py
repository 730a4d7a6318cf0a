"""A preset that exists only here: a tiny ICT run and a tiny pre-training
run without retrieval on the test corpus, the latter scored, through the
same runner as the shipped presets (tests/test_demo.py)."""

from realm_jax.experiments.preset import Preset, Stage

TINY = {'BertConfig.hidden_size': 32, 'BertConfig.num_heads': 4,
        'BertConfig.intermediate_size': 64,
        'build_realm.projection_size': 16, 'build_realm.reader_length': 64,
        'train.batch_size': 8, 'bert_adamw.warmup_steps': 1,
        'train.num_steps': 2}

PRESET = Preset(
    family='demo', setup='gin/models/tiny.gin',
    sizes={'ict_steps': 2, 'pretrain_steps': 2},
    stages=(
        Stage('corpus', 'corpus', {'block_length': 288}, result=''),
        Stage('machine', 'machine', timed=False),
        Stage('ict', 'train', {'run': 'ict', 'bindings': {
            **TINY, 'Ict.bert_dir': ''}}),
        Stage('pretrain_realm', 'train', {
            'run': 'pretrain', 'run_dir': 'realm', 'bindings': {
                **TINY, 'Pretrain.num_candidates': 1,
                'Pretrain.query_length': 32, 'Pretrain.max_masked': 8,
                'Pretrain.bert_dir': ''}}),
        Stage('masked_lm_realm', 'masked_lm', {'run_dir': 'realm'},
              result='masked_lm/realm')),
    prepared=True)
