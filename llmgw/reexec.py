"""One llmgw process started again in its own place: ``execv`` of the same command line,
so the process id stays (systemd's unit, a pid file and an agent's engines, which are its
children, all still point at it) and the program is read again from its file: after an
upgrade swapped the zipapp by rename, the new version.

``keep_fds`` are left open across the exec (listening sockets handed to the new program,
named to it in ``env``); every other descriptor Python opened closes, as they are not
inheritable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn


def command_line() -> list[str]:
    """How this process was started, as ``execv`` takes it."""
    args = list(sys.argv)
    if args and args[0].endswith("__main__.py"):  # started as `python -m llmgw`
        args = ["-m", "llmgw", *args[1:]]
    return [sys.executable, *args]


def exec_again(keep_fds: Sequence[int] = (), env: Mapping[str, str] | None = None) -> NoReturn:
    """This process again, as it was started (see the module's words)."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for fd in keep_fds:
        os.set_inheritable(fd, True)
    argv = command_line()
    os.execve(sys.executable, argv, {**os.environ, **(env or {})})
