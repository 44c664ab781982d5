"""The commands a person runs against a control plane: the admin API client, tables, the
``ctl`` commands and ``node add``."""

from llmgw.cliargs import UsageError, parse_duration

__all__ = ["UsageError", "parse_duration"]
