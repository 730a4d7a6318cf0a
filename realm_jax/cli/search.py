"""`realm-jax search`: a query searched with any run's retriever."""

from realm_jax.cli import common

COMMAND = 'search'


def add_parser(command, flags) -> None:
  del flags
  search = command(
      'search', help="Retrieve with any run's retriever (ICT, pre-training, "
      'fine-tuning, or MiniLM\'s warm start): the top blocks of a query with '
      'their scores and p(z|x) over them. The quickest look at what a '
      'retriever learned.')
  common.one_or_many_arguments(
      search, ('query', 'e.g. "origin of species author"'),
      ('--queries', 'queries', 'searched'),
      'A `realm-jax train` run of any kind.', 'query', 'each block with its '
      'id, title, opening words, score and p(z|x)')
  search.add_argument('--top_k', type=int, default=5,
                      help='Blocks shown per query (at most every block).')


def run(args) -> None:
  from realm_jax.evaluation.prediction import QAPredictor  # pylint: disable=g-import-not-at-top
  common.check_top_k(args.top_k)
  with common.one_or_many('search', args.query, args.queries, args.output) as (
      queries, _, write):
    predictor = QAPredictor(args.model_dir, top_k=args.top_k, read=False)
    for n, (_, query) in enumerate(queries):
      result = predictor.search(query)
      if n:
        print()
      print(f'Q: {query}   ({result["kind"]} step {result["step"]}, index '
            f'step {result["index_step"]})')
      print(f'{"rank":>4} {"score":>8} {"p(z|x)":>7}  block')
      for rank, block in enumerate(result['blocks'], 1):
        print(f'{rank:4d} {block["score"]:8.3f} {block["p_z"]:7.3f}  '
              f'{block["title"]}: {block["text"]}')
      write(result)
