"""`realm-jax export`: a run in the formats the field's tools load."""

from realm_jax.cli import common

COMMAND = 'export'


def add_parser(command, flags) -> None:
  del flags
  export = command(
      'export', help='Write a run (ICT, pre-training or fine-tuning) for '
      'the tools users already run: both towers as sentence-transformers '
      'models, the reader as a transformers BertForMaskedLM, the newest '
      'index as a FAISS file with its block ids and texts, a model card and '
      'a manifest of sha256s (docs/usage.md, "Export").',
      epilog='e.g. realm-jax export --model_dir=runs/demo/realm '
      '--output=exports/realm')
  export.add_argument('--model_dir', required=True,
                      help='The run to export: its newest checkpoint and '
                      'newest published index.')
  export.add_argument('--output', required=True,
                      help='The directory to write (must not exist).')


def run(args) -> None:
  from realm_jax.export import writer  # pylint: disable=g-import-not-at-top
  common.check_output_dir(args.output, '--output')
  manifest = writer.export(args.model_dir, args.output)
  run_ = manifest['run']
  print(f'exported the {run_["kind"]} run at step {run_["step"]} (index step '
        f'{run_["index_step"]}) into {args.output}: '
        f'{", ".join(manifest["parts"])}, {len(manifest["files"])} files')
