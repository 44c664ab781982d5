"""The commands a person runs against a control plane: the admin API client, tables, the ``ctl``
commands and ``node add``."""
