"""The commands a person runs against a control plane: the admin API client, tables, the ``ctl``
commands and ``node add``."""


class UsageError(RuntimeError):
    """Bad input on the command line; printed without a traceback."""
