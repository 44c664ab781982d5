"""Where the kernel's ephemeral ports (NCCL's, gloo's, vLLM's own when unpinned) fall in
the engine port range: the part the members of a replica spanning nodes are let in to."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.ephemeral import overlap, parse_local_range, parse_reserved, read_ephemeral

ENGINES = (41000, 41999)


def test_the_sysctls_are_read_as_the_kernel_writes_them() -> None:
    assert parse_local_range("32768\t60999\n") == (32768, 60999)
    assert parse_local_range("1024 65535") == (1024, 65535)
    for bad in ("", "32768", "60999 32768", "a b", "0 100", "1 70000"):
        assert parse_local_range(bad) is None, bad
    assert parse_reserved("\n") == []
    assert parse_reserved("8080,41000-41999\n") == [(8080, 8080), (41000, 41999)]
    assert parse_reserved("9-3,x,50") == [(50, 50)]


@pytest.mark.parametrize(
    ("local", "reserved", "expected"),
    [
        # Linux's default: the whole engine range may be handed out.
        ((32768, 60999), [], [ENGINES]),
        # The admin reserved the engine range: nothing of it is ever handed out.
        ((32768, 60999), [(41000, 41999)], []),
        # Reserved in part: the rest, in pieces.
        (
            (32768, 60999),
            [(41100, 41199), (41500, 41500)],
            [(41000, 41099), (41200, 41499), (41501, 41999)],
        ),  # noqa: E501
        # An ephemeral range that starts inside the engine range, or misses it.
        ((41900, 60999), [], [(41900, 41999)]),
        ((49152, 65535), [], []),
        # Not read: any port could be picked.
        (None, [], [ENGINES]),
    ],
)
def test_the_part_of_the_engine_range_the_kernel_may_pick(
    local: tuple[int, int] | None, reserved: list[tuple[int, int]], expected: list[tuple[int, int]]
) -> None:
    assert overlap(ENGINES, local, reserved) == expected


def test_reading_the_sysctls(tmp_path: Path) -> None:
    assert read_ephemeral(tmp_path) == (None, [])
    (tmp_path / "ip_local_port_range").write_text("32768\t60999\n")
    (tmp_path / "ip_local_reserved_ports").write_text("41000-41499\n")
    assert read_ephemeral(tmp_path) == ((32768, 60999), [(41000, 41499)])
