"""The implementation of the ``cerebrax`` command (see :mod:`cerebrax.cli`)."""
