"""What the dashboard's templates show, one module per page's noun: each row a frozen
dataclass built here from records, reports, releases and candidates, so a template reads
fields (`row.prompt`), never a dict's keys. Pure functions, no I/O: the pages (api.ui.pages)
read the store, these shape what they read.

  text        numbers, ages and short previews (the templates' `num`, `age`, `short`)
  overview    a scenario's row: traffic bars, learning-curve sparkline
  records     a record's table row; a session's turns, messages and log-prob heat strip
  releases    a release's timeline row, its links out (MLflow, Prefect); a harness diff
  candidates  a candidate's card or row
  curves      the learning chart's series and the table rows beside it
  quotas      a token's limit and its use
"""
