"""Moved: ``inspect-shards`` is :mod:`reader.inspect_cli` (installed as a console script).

This shim keeps ``python -m scripts.inspect_shards`` and imports of
``scripts.inspect_shards`` working from a checkout; new code imports
:mod:`reader.inspect_cli`.
"""

import sys

from reader.inspect_cli import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
