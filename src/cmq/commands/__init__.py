"""Subcommands of the ``cmq`` command, one module each (see :mod:`cmq.cli`)."""
