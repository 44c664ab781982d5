"""The commands a person runs against a control plane: the admin API client, tables, the
``ctl`` commands and ``node add``."""

from typing import TYPE_CHECKING, TypeAlias

from llmgw.cliargs import UsageError, parse_duration

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from llmgw.client.admin import AdminClient

# How a command finds its control plane: from its parsed options (``--server`` ...).
Client: TypeAlias = "Callable[[argparse.Namespace], AdminClient]"
# What ``add_subparsers()`` answers: each command module adds its commands to one.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

__all__ = ["Client", "Subcommands", "UsageError", "parse_duration"]
