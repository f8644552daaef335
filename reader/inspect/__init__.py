"""``inspect-shards``: look into a dataset (info, verify, ls, show, extract, stats) and
summarize monitor records (monitor-report).

:mod:`~reader.inspect.cli` (the command line: subcommands, parsing, exit status) and
:mod:`~reader.inspect.commands` (the handlers and their tables). It reads datasets
through :mod:`reader.data` and monitor records through :mod:`reader.monitor.report`,
and never imports the Loader's runtime.
"""
