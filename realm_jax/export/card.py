"""The model card of an export: a README.md as Hugging Face's are written
(metadata block, what it is, how to load each part, training, evaluation,
licenses), from what the run itself records."""

import json
import re

from etils import epath

from realm_jax import run_directory

# What the run's gin config says about how it was trained.
SETTINGS = ('train.num_steps', 'train.batch_size', 'bert_adamw.learning_rate',
            'Pretrain.num_candidates', 'Finetune.num_candidates',
            'Pretrain.bert_dir', 'Ict.bert_dir', 'Finetune.bert_dir',
            'Pretrain.ict_model_dir', 'Finetune.pretrain_model_dir',
            'BertConfig.num_layers', 'BertConfig.hidden_size',
            'build_realm.projection_size', 'build_realm.reader_length',
            'Pretrain.masking')
# The index builder's cadence, from the run's record (run_directory.RECORD):
# the trainer's operative config never holds the builder's settings.
CADENCE = ('refresh_interval_steps', 'stale_factor')
KINDS = {'Ict': 'the Inverse Cloze Task retriever (ORQA), REALM\'s warm start',
         'Pretrain': 'REALM pre-training: a retriever and a masked-LM reader '
                     'trained together through retrieval',
         'Finetune': 'REALM fine-tuned for open-domain QA'}
# Licenses of what a run may start from, by a word in its path.
LICENSES = {'minilm': 'all-MiniLM-L6-v2: Apache-2.0',
            'bert': "Google's BERT: Apache-2.0",
            'wiki': 'Wikipedia text: CC BY-SA 4.0'}


def _setting(config: str, name: str) -> str | None:
  match = re.search(rf'^{re.escape(name)} = (.+)$', config, re.MULTILINE)
  return match.group(1).strip() if match else None


def settings(config: str, record: dict | None) -> list[tuple[str, str]]:
  """(name, value) of each training setting the run's operative `config`
  or its `record` gives."""
  found = [(name, _setting(config, name)) for name in SETTINGS]
  cadence = (record or {}).get('refresh') or {}
  found += [(f'run_refresh.{name}', cadence.get(name)) for name in CADENCE]
  return [(name, str(value)) for name, value in found if value is not None]


def _evaluations(model_dir: str) -> list[str]:
  """Each `<task>_metrics.json` under the run's eval/, as written."""
  lines = []
  for path in sorted((epath.Path(model_dir) / 'eval').glob('*_metrics.json')):
    try:
      summary = json.loads(path.read_text())
    except ValueError:
      continue
    figures = ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else
                        f'{k} {v}' for k, v in summary.items()
                        if isinstance(v, (int, float)))
    lines.append(f'- `{path.name}`: {figures}')
  return lines or ['- none: the run was not evaluated (`realm-jax eval`).']


def _licenses(texts) -> list[str]:
  joined = ' '.join(texts).lower()
  found = [text for word, text in LICENSES.items() if word in joined]
  return [f'- {text}' for text in found] or [
      '- not known from the run: check the weights and corpus it started '
      'from.']


def model_card(manifest: dict, loaded, scale: float) -> str:
  """README.md of the export `manifest` describes, for `loaded`'s run;
  `scale`: what each projection is stored multiplied by."""
  run, corpus = manifest['run'], manifest['corpus']
  trained = settings(loaded.config, run_directory.read_record(
      run['model_dir']))
  towers = run['towers']
  eps = towers['config']['layer_norm_eps']
  started = [value for name, value in trained if name.endswith(
      ('bert_dir', 'model_dir'))]
  parts = manifest['parts']
  lines = [
      '---', 'library_name: sentence-transformers',
      'tags: [realm, retrieval, dense-retrieval, feature-extraction'
      + (', fill-mask' if 'reader' in parts else '') + ']',
      'pipeline_tag: sentence-similarity', '---', '',
      f'# {run["kind"]} run, step {run["step"]:,}', '',
      f'Exported by realm-jax from `{run["model_dir"]}`: '
      f'{KINDS.get(run["kind"], run["kind"])}. REALM: Guu et al. 2020, '
      '"Retrieval-Augmented Language Model Pre-Training".', '',
      '## Parts', '',
      '| directory | what | load with |', '|---|---|---|',
      '| `query_encoder/` | the query tower: BERT, '
      f'{towers["pooling"]} pooling, a {towers["projection_size"]}-wide '
      'projection and LayerNorm | `SentenceTransformer(path)` |',
      '| `document_encoder/` | the document tower, reading `(title, body)` '
      'pairs as `[CLS] title [SEP] body [SEP]` | `SentenceTransformer(path)` |']
  if 'reader' in parts:
    lines.append('| `reader/` | the reader\'s BERT and masked-LM head, tied to '
                 'the word embeddings | `BertForMaskedLM.from_pretrained(path)`'
                 ', `pipeline("fill-mask", model=path)` |')
  lines += [
      '| `index/` | the published index of step '
      f'{run["index_step"]:,}: `index` (FAISS `IndexFlatIP`, inner product), '
      '`docid` (one block id a row, as Pyserini\'s FAISS searcher reads), '
      '`blocks.jsonl` (`id`, `title`, `text`) | `faiss.read_index(path)` |',
      '| `config.gin` | the run\'s gin config | `realm-jax import --export` |',
      '| `manifest.json` | every file with its size and sha256 | |', '',
      'Relevance is the inner product of the two towers\' embeddings '
      '(`similarity_fn_name` "dot"); '
      + ('they share one BERT' if towers['share_towers'] else
         'each tower has its own BERT')]
  lines[-1] += (
      f'. Each projection is stored multiplied by {scale:g}: '
      'sentence-transformers\' LayerNorm has an epsilon of 1e-5, the '
      f'run\'s {eps:g}, and LayerNorm(s x, 1e-5) is LayerNorm(x, 1e-5 / '
      's^2). Loading a tower, transformers warns that BertModel\'s pooler '
      'was newly initialized: no tower reads it.')
  embedded_by = manifest['index'].get('params_step', run['index_step'])
  if embedded_by != run['step']:
    lines += ['', f'**The index was embedded by the towers of step '
              f'{embedded_by:,}**, the encoders here are step {run["step"]:,}\'s '
              '(as `realm-jax search` pairs them): re-embed the blocks with '
              '`document_encoder/` before adding to it.']
  if run['kind'] == 'Finetune':
    lines += ['', '`reader/span_head.safetensors` holds ORQA\'s span scorer '
              'as the run trained it: `start.weight` and `end.weight` '
              '[projection, hidden] with their biases project each token; a '
              'span (i, j) scores `score(LayerNorm(relu(start_i + end_j)))` '
              '(`layer_norm.weight`/`.bias`, `score.weight` [1, projection]).']
  lines += [
      '', '## Search the index without JAX', '', '```python',
      'import json, faiss',
      'from sentence_transformers import SentenceTransformer',
      'queries = SentenceTransformer("query_encoder")',
      'index = faiss.read_index("index/index")',
      'ids = open("index/docid").read().split()',
      'blocks = {b["id"]: b for b in map(json.loads, open("index/blocks.jsonl"))}',
      'scores, rows = index.search(queries.encode(["who wrote hamlet?"]), 5)',
      'for score, row in zip(scores[0], rows[0]):',
      '    print(f"{score:.2f}", blocks[ids[row]]["title"])', '```', '',
      '## Training', '',
      f'- corpus `{corpus["name"]}`: {corpus["num_blocks"]:,} blocks, '
      f'fingerprint `{corpus["fingerprint"]}`'
      + (f', from {", ".join(map(str, corpus["sources"]))}'
         if corpus['sources'] else ''),
      *(f'- `{name}` = {value}' for name, value in trained), '',
      '## Evaluation', '', *_evaluations(run['model_dir']), '',
      '## Licenses', '', 'Of the weights and data the run started from:',
      *_licenses([*started, corpus['name'], *map(str, corpus['sources'])]),
      '']
  return '\n'.join(lines)
