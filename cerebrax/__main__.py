"""``python -m cerebrax``: the ``cerebrax`` command (see :mod:`cerebrax.cli`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
