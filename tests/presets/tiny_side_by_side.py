"""A preset whose training stages run side by side (`Preset.concurrent`): a
tiny ICT run beside a tiny warm reader, then REALM from both with the index
builder beside it and a baseline without retrieval, each scored
(tests/test_runner.py)."""

from realm_jax.experiments.preset import Dir, Preset, Stage

TINY = {'build_realm.reader_length': 64, 'train.batch_size': 8,
        'bert_adamw.warmup_steps': 1, 'train.num_steps': 2,
        'Pretrain.query_length': 32, 'Pretrain.max_masked': 8,
        'Pretrain.bert_dir': '', 'Ict.bert_dir': ''}


def pretrain(name, candidates, **more):
  return Stage(f'pretrain_{name}', 'train', {
      'run': 'pretrain', 'run_dir': name, 'bindings': {
          **TINY, 'Pretrain.num_candidates': candidates,
          'Pretrain.reader_model_dir': Dir('reader'), **more},
      'builder': {'run_refresh.refresh_interval_steps': 1}
      if candidates > 1 else None}, memory=0.5)


PRESET = Preset(
    family='demo', setup='gin/models/tiny.gin',
    sizes={'ict_steps': 2, 'reader_steps': 2, 'pretrain_steps': 2},
    stages=(
        Stage('corpus', 'corpus', {'block_length': 288}, result=''),
        Stage('machine', 'machine', timed=False),
        Stage('ict', 'train', {'run': 'ict', 'bindings': TINY}, memory=0.5),
        Stage('reader', 'train', {'run': 'pretrain', 'bindings': {
            **TINY, 'Pretrain.num_candidates': 1}}, memory=0.5),
        pretrain('realm', 2, **{'Pretrain.ict_model_dir': Dir('ict'),
                                'train.retriever_every': 1}),
        pretrain('baseline', 1),
        Stage('masked_lm_baseline', 'masked_lm', {'run_dir': 'baseline'},
              result='masked_lm/baseline'),
        Stage('masked_lm_realm', 'masked_lm', {'run_dir': 'realm'},
              result='masked_lm/realm')),
    prepared=True, concurrent=2, memory=0.2)
