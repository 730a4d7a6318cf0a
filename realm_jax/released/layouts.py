"""Where each weight of Google's released REALM lives, in each released file.

Google released REALM as TensorFlow files (TF-Hub modules of the pre-trained
embedder and knowledge-augmented encoder, ORQA checkpoints of the fine-tuned
Open-QA models); Hugging Face converted them to PyTorch state dicts. Both
name the same weights under different prefixes, and PyTorch stores kernels
transposed. A `Layout` is one file's naming; `match_layout` picks the one a
file follows, and `layout_tensors` lists every weight it must hold, with
its place in our parameter tree: the retriever tower (share_towers, BERT
with its pooler, then the 128-wide projection and LayerNorm) and the reader
(BERT, the masked-LM head, ORQA's span scorer).
"""

import dataclasses
import re

from realm_jax.models import bert, pretrained
from realm_jax.models.pretrained import Tensor
from realm_jax.models.realm import Realm

# Optimizer slots and step counters (TF), non-parameter buffers (PyTorch).
_ALWAYS_IGNORED = (r'(^|/)(adam_[mv]|global_step|AdamWeightDecayOptimizer'
                   r'(_1)?)(/|$)', r'\.(position_ids|token_type_ids)$')
BLOCK_EMB = 'block_emb'


@dataclasses.dataclass(frozen=True)
class Layout:
  """One released file's naming: the prefix of each part it holds (None:
  not in this file) and the other tensors it may hold that we do not use."""
  name: str
  description: str
  hf: bool  # PyTorch names, kernels [out, in]; else TensorFlow's, [in, out].
  embedder: str | None = None  # the retriever tower's BERT
  projection: str | None = None  # the tower's dense layer and LayerNorm
  reader: str | None = None  # the reader's BERT
  mlm_head: str | None = None  # BERT's masked-LM head
  span_head: str | None = None  # ORQA's span scorer
  ignored: tuple[str, ...] = ()

  @property
  def parts(self) -> tuple[str, ...]:
    """What the file gives our model: 'retriever', 'reader', 'span_head'."""
    return tuple(part for part, prefix in (
        ('retriever', self.embedder), ('reader', self.reader),
        ('span_head', self.span_head)) if prefix is not None)

  def is_ignored(self, name: str) -> bool:
    return any(re.search(p, name) for p in _ALWAYS_IGNORED + self.ignored)


LAYOUTS = (
    Layout('orqa', 'an ORQA checkpoint fine-tuned from REALM '
           '(orqa_{nq,wq}_model_from_realm)', hf=False,
           embedder='module/module/module/module/bert/',
           projection='module/module/module/',
           reader='reader/module/bert/',
           mlm_head='reader/module/cls/predictions/', span_head='reader/',
           ignored=(r'^module/module/module/module/cls/',
                    r'^reader/module/bert/pooler/', r'^block_emb$')),
    Layout('hub_embedder', 'the pre-trained embedder TF-Hub module '
           '(cc_news_pretrained/embedder)', hf=False,
           embedder='module/module/module/bert/', projection='module/module/',
           ignored=(r'^module/module/module/cls/',)),
    Layout('hub_bert', 'the pre-trained knowledge-augmented encoder TF-Hub '
           'module (cc_news_pretrained/bert)', hf=False, reader='bert/',
           mlm_head='cls/predictions/',
           ignored=(r'^bert/pooler/', r'^cls/seq_relationship/')),
    Layout('hf_openqa', "Hugging Face's RealmForOpenQA "
           '(google/realm-orqa-{nq,wq}-openqa, '
           'google/realm-cc-news-pretrained-openqa)', hf=True,
           embedder='embedder.realm.', projection='embedder.cls.',
           reader='reader.realm.', mlm_head='reader.cls.predictions.',
           span_head='reader.qa_outputs.',
           ignored=(r'^embedder\.cls\.predictions\.',
                    r'^reader\.cls\.predictions\.decoder\.',
                    r'^reader\.realm\.pooler\.', r'^block_emb$')),
    Layout('hf_embedder', "Hugging Face's RealmEmbedder "
           '(google/realm-cc-news-pretrained-embedder)', hf=True,
           embedder='realm.', projection='cls.',
           ignored=(r'^cls\.predictions\.',)),
    Layout('hf_scorer', "Hugging Face's RealmScorer "
           '(google/realm-cc-news-pretrained-scorer)', hf=True,
           embedder='embedder.realm.', projection='embedder.cls.',
           ignored=(r'^embedder\.cls\.predictions\.',)),
    Layout('hf_encoder', "Hugging Face's RealmKnowledgeAugEncoder "
           '(google/realm-cc-news-pretrained-encoder)', hf=True,
           reader='realm.', mlm_head='cls.predictions.',
           ignored=(r'^realm\.pooler\.', r'^cls\.predictions\.decoder\.')),
    Layout('hf_reader', "Hugging Face's RealmReader "
           '(google/realm-orqa-{nq,wq}-reader)', hf=True, reader='realm.',
           mlm_head='cls.predictions.', span_head='qa_outputs.',
           ignored=(r'^realm\.pooler\.', r'^cls\.predictions\.decoder\.')),
)


def _named(tensor: Tensor, path: tuple[str, ...], name: str) -> Tensor:
  """`tensor` at `path` + its own path, called `name` in the file."""
  return dataclasses.replace(tensor, path=path + tensor.path, hf_name=name,
                             tf_name=name)


def _bert(layout: Layout, prefix: str, config, path) -> list[Tensor]:
  """A BERT's tensors under `prefix` (which, in TF, ends with 'bert/'), its
  layers unrolled as the files hold them (`in_model_layout` stacks them)."""
  def name(t: Tensor) -> str:
    return prefix + (t.hf_name if layout.hf else t.tf_name.removeprefix(
        'bert/'))
  return [_named(t, path, name(t)) for t in pretrained.bert_tensors(config)]


def _sep(layout: Layout) -> str:
  return '.' if layout.hf else '/'


def _dense(layout, path, prefix, name, shape, half=None) -> list[Tensor]:
  tensors = pretrained.dense_tensors(path, prefix + name, prefix + name,
                                     shape)
  return [dataclasses.replace(t, half=half) for t in tensors]


def berts(model: Realm) -> dict[tuple[str, ...], bert.BertConfig]:
  """Where each BERT a released file may hold lives in our parameter tree,
  and its config: the (shared) retriever tower's, with its pooler, and the
  reader's."""
  return {('retriever', 'embedder', 'bert'): dataclasses.replace(
      model.retriever_config, add_pooler=True),
          ('reader', 'bert'): model.reader_config}


def layout_tensors(layout: Layout, model: Realm) -> list[Tensor]:
  """Every tensor `layout` must hold for `model` (a Realm with shared towers
  and pooler pooling), with its path in our parameter tree."""
  retriever, reader = model.retriever_config, model.reader_config
  h, s = reader.hidden_size, model.span_projection_size
  sep = _sep(layout)
  tensors = []
  (tower_bert, tower_config), (reader_bert, _) = berts(model).items()
  if layout.embedder is not None:
    tower = tower_bert[:-1]
    tensors += _bert(layout, layout.embedder, tower_config, tower_bert)
    p = layout.projection
    tensors += _dense(layout, tower + ('projection',), p, 'dense',
                      (retriever.hidden_size, model.projection_size))
    tensors += pretrained.layer_norm_tensors(
        tower + ('layer_norm',), p + 'LayerNorm', p + 'LayerNorm',
        model.projection_size)
  if layout.reader is not None:
    tensors += _bert(layout, layout.reader, reader, reader_bert)
    m, head = layout.mlm_head, ('reader', 'mlm_head')
    transform = m + 'transform' + sep
    tensors += _dense(layout, head + ('transform',), transform, 'dense',
                      (h, h))
    tensors += pretrained.layer_norm_tensors(
        head + ('transform_layer_norm',), transform + 'LayerNorm',
        transform + 'LayerNorm', h)
    bias = m + ('bias' if layout.hf else 'output_bias')
    tensors.append(Tensor(head + ('output_bias',), (reader.vocab_size,), bias,
                          bias))
  if layout.span_head is not None:
    q, head = layout.span_head, ('reader', 'span_head')
    intermediate, output = (('dense_intermediate', 'dense_output')
                            if layout.hf else ('dense', 'dense_1'))
    tensors += _dense(layout, head + ('start',), q, intermediate, (h, s), 0)
    tensors += _dense(layout, head + ('end',), q, intermediate, (h, s), 1)
    tensors += pretrained.layer_norm_tensors(
        head + ('layer_norm',), q + 'layer_normalization',
        q + 'layer_normalization', s)
    tensors += _dense(layout, head + ('score',), q, output, (s, 1))
  return tensors


def in_model_layout(params: dict, model: Realm) -> dict:
  """Parameters read from a released file (each BERT's layers unrolled) with
  each BERT in the layout of its config (stacked when it scans)."""
  for path, config in berts(model).items():
    parent = params
    for key in path[:-1]:
      parent = parent.get(key, {})
    if path[-1] in parent:
      parent[path[-1]] = bert.in_layout(parent[path[-1]], config)
  return params


def expected_names(layout: Layout, model: Realm) -> dict[str, list[Tensor]]:
  """File name -> the parameters read from it (two for the span scorer's
  shared start/end layer)."""
  names: dict[str, list[Tensor]] = {}
  for tensor in layout_tensors(layout, model):
    names.setdefault(tensor.name(layout.hf), []).append(tensor)
  return names


def match_layout(names, model: Realm) -> tuple[Layout, int]:
  """The layout a file with tensors `names` follows, and how many of its
  tensors are missing or unexpected under it (0 for a whole file)."""
  names = set(names)

  def misfit(layout: Layout) -> int:
    expected = expected_names(layout, model)
    missing = sum(1 for n in expected if n not in names)
    unexpected = sum(1 for n in names
                     if n not in expected and not layout.is_ignored(n))
    return missing + unexpected

  return min(((layout, misfit(layout)) for layout in LAYOUTS),
             key=lambda pair: pair[1])
