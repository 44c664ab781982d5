"""What the guard's pattern rules cost a prompt: ``rules.pii`` and ``rules.injections``
over a 4,000-token prompt (about 16,000 characters) of ordinary text, with nothing to
find, and over texts of growing length, so a pattern that cost the square of its text
would show. Each figure is the best of several repeats (other work on shared cores only
ever adds time); a reference loop is timed beside them, so figures from a loaded
machine can be read against an idle one.

    .venv/bin/python bench/guard.py
    .venv/bin/python bench/guard.py --repeat 9 --number 200
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.server.guard import rules  # noqa: E402

# Ordinary English with numbers, capitals and markdown, as prompts hold: nothing the
# rules find (checked before timing).
PARAGRAPH = (
    "## Summary\n"
    "The build farm moved to the new scheduler in March 2024; 42 jobs run each night and "
    "3 of them retry once. The NAS holds 120 TB, of which 87 are used, and the old arrays "
    "stay read-only until the end of Q2. Version 2.14.1 of the runner fixed the timeout "
    "that stopped 7 builds last week (see issue 1893). Ask the platform team in #infra if "
    "a job waits longer than 15 minutes, and note the time you saw it in UTC.\n\n"
)


def prompt(chars: int) -> str:
    return (PARAGRAPH * (chars // len(PARAGRAPH) + 1))[:chars]


def best(fn: object, number: int, repeat: int) -> float:
    """Microseconds a call, the best of ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--chars", type=int, default=16_000, help="the prompt's length")
    parser.add_argument("--number", type=int, default=100, help="calls a repeat")
    parser.add_argument("--repeat", type=int, default=5, help="repeats (the best is kept)")
    args = parser.parse_args(argv)
    text = prompt(args.chars)
    if rules.pii(text) or rules.injections(text):
        raise SystemExit("the benchmark's prompt holds something the rules find")
    reference = best(lambda: sum(range(10_000)), args.number, args.repeat)
    print(f"reference: sum(range(10000)) {reference:.1f} us")
    pii = best(lambda: rules.pii(text), args.number, args.repeat)
    planted = best(lambda: rules.injections(text), args.number, args.repeat)
    print(f"{len(text)} characters, nothing found:")
    print(f"  pii         {pii:8.1f} us")
    print(f"  injections  {planted:8.1f} us")
    print(f"  both        {pii + planted:8.1f} us  ({(pii + planted) / reference:.2f} x reference)")
    print("growing texts (both rules; linear: each row about twice the last):")
    for chars in (4_000, 8_000, 16_000, 32_000, 64_000):
        longer = prompt(chars)
        cost = best(lambda t=longer: (rules.pii(t), rules.injections(t)), 20, args.repeat)
        print(f"  {chars:6} chars {cost:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
