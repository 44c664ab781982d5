"""What every role's command line shares: the error for bad input and the parsers of
plain values (durations), so a role's own commands need nothing of another role."""

from __future__ import annotations

import argparse
import re


class UsageError(RuntimeError):
    """Bad input on the command line; printed without a traceback."""


def parse_duration(text: str) -> int:
    """'90', '90s', '30m', '1h', '2d' as seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (like 30m, 1h, 2d)")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
