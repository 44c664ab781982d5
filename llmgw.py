#!/usr/bin/env python3
"""llmgw from a checkout: ``python3 llmgw.py ARGS`` runs every role, as the installed
``llmgw`` command and the zipapp do (the ``llmgw/`` package beside this file is what
runs; its dependencies must be importable, as in ``.venv``)."""

from llmgw.cli import entry

if __name__ == "__main__":
    entry()
