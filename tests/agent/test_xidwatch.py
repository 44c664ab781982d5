"""XidWatch: Xids per card from a /dev/kmsg-format file, or from NVML's events."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from llmgw.agent.discovery import xidwatch as xidwatch_module
from llmgw.agent.discovery.xid import xid_meaning
from llmgw.agent.discovery.xidwatch import XidWatch, boot_time
from llmgw.wire.hardware import XidSeen

BOOT = 1_700_000_000.0
CARD_3B = "GPU-3b3b3b3b-0000-4000-8000-000000000001"
CARD_19 = "GPU-19191919-0000-4000-8000-000000000002"
# nvidia-smi's and NVML's forms of the bus ids; the kernel log writes '0000:3b:00'.
CARDS = {"00000000:3B:00.0": CARD_3B, "00000000:19:00.0": CARD_19}


def record(seq: int, micros: int, message: str, priority: int = 4) -> str:
    return f"{priority},{seq},{micros},-;{message}\n"


def xid(
    pci: str, code: int, rest: str = "pid=4021, name=python3, GPU has fallen off the bus."
) -> str:
    return f"NVRM: Xid (PCI:{pci}): {code}, {rest}"


def write(path: Path, *records: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(records))


@pytest.fixture
def kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("")
    return path


def test_counts_per_card_by_bus_id(kmsg: Path) -> None:
    write(
        kmsg,
        record(1, 4_812_345, "nvidia: loading out-of-tree module taints kernel.", 6),
        record(2, 8_123_004_512, xid("0000:3b:00", 62, "322bff9a 0000b3b8 00000000")),
        " SUBSYSTEM=pci\n",
        " DEVICE=+pci:0000:3b:00.0\n",
        record(3, 86_400_118_283, xid("0000:19:00", 79)),
        record(4, 86_400_500_000, xid("0000:3b:00", 62, "pid='<unknown>', name=<unknown>, 1")),
        record(5, 86_401_000_000, "NVRM: GPU 0000:19:00.0: GPU has fallen off the bus.", 3),
    )
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.uses_kernel_log
    assert watch.seen(CARD_3B) == [
        XidSeen(code=62, count=2, last=BOOT + 86_400.5, meaning=xid_meaning(62)[0])
    ]
    assert watch.seen(CARD_19) == [
        XidSeen(code=79, count=1, last=BOOT + 86_400.118283, meaning=xid_meaning(79)[0])
    ]
    assert watch.seen("GPU-other") == []
    watch.close()


def test_seen_is_oldest_last_first(kmsg: Path) -> None:
    write(
        kmsg,
        record(1, 3_000_000, xid("0000:3b:00", 13)),
        record(2, 1_000_000, xid("0000:3b:00", 31)),  # out of order: the time decides
        record(3, 2_000_000, xid("0000:3b:00", 43)),
    )
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert [(s.code, s.last) for s in watch.seen(CARD_3B)] == [
        (31, BOOT + 1),
        (43, BOOT + 2),
        (13, BOOT + 3),
    ]
    watch.close()


def test_a_later_record_with_an_earlier_time_keeps_the_latest(kmsg: Path) -> None:
    write(
        kmsg,
        record(1, 9_000_000, xid("0000:3b:00", 13)),
        record(2, 5_000_000, xid("0000:3b:00", 13)),
    )
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.seen(CARD_3B) == [XidSeen(13, 2, BOOT + 9, xid_meaning(13)[0])]
    watch.close()


def test_an_unknown_bus_is_kept_under_its_pci_address(kmsg: Path) -> None:
    write(kmsg, record(1, 7_000_000, xid("0000:AF:00", 48)))
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.seen("pci:0000:af:00") == [XidSeen(48, 1, BOOT + 7, xid_meaning(48)[0])]
    assert watch.seen(CARD_3B) == [] and watch.seen(CARD_19) == []
    watch.close()


def test_bus_id_forms_all_meet(kmsg: Path) -> None:
    write(
        kmsg,
        record(1, 1_000_000, xid("0000:3b:00", 79)),
        record(2, 2_000_000, xid("0000:3B:00.0", 79)),
    )
    for form in ("00000000:3B:00.0", "0000:3b:00.0", "00000000:3b:00.0", "0000:3b:00"):
        watch = XidWatch(kmsg, boot=BOOT)
        watch.read({form: CARD_3B})
        assert [(s.code, s.count) for s in watch.seen(CARD_3B)] == [(79, 2)], form
        watch.close()


def test_only_new_records_are_read_the_next_time(kmsg: Path) -> None:
    write(kmsg, record(1, 1_000_000, xid("0000:3b:00", 79)))
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    watch.read(CARDS)  # nothing new: nothing counted twice
    assert [(s.code, s.count) for s in watch.seen(CARD_3B)] == [(79, 1)]
    write(
        kmsg,
        record(2, 5_000_000, xid("0000:3b:00", 79)),
        record(3, 6_000_000, xid("0000:19:00", 74)),
    )
    watch.read(CARDS)
    assert watch.seen(CARD_3B) == [XidSeen(79, 2, BOOT + 5, xid_meaning(79)[0])]
    assert [(s.code, s.count, s.last) for s in watch.seen(CARD_19)] == [(74, 1, BOOT + 6)]
    watch.close()


def test_a_record_split_across_reads_is_joined(kmsg: Path) -> None:
    # Fill the file so the Xid record starts 40 bytes before the 8192-byte read ends.
    filler = record(1, 1_000_000, "x" * 100, 6)
    count = (8192 - 40) // len(filler)
    pad = 8192 - 40 - count * len(filler)
    head = filler * count + record(2, 1_500_000, "y" * (pad - len(record(2, 1_500_000, ""))), 6)
    seq = 3
    split = record(seq, 42_000_000, xid("0000:3b:00", 79))
    text = head + split + record(seq + 1, 43_000_000, xid("0000:19:00", 48))
    kmsg.write_text(text)
    start = len(head.encode())
    assert start == 8192 - 40 and len(split.encode()) > 40
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.seen(CARD_3B) == [XidSeen(79, 1, BOOT + 42, xid_meaning(79)[0])]
    assert [(s.code, s.last) for s in watch.seen(CARD_19)] == [(48, BOOT + 43)]
    watch.close()


def test_a_record_without_its_newline_waits_for_the_rest(kmsg: Path) -> None:
    whole = record(1, 2_000_000, xid("0000:3b:00", 79))
    kmsg.write_text(whole[:40])
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.seen(CARD_3B) == []
    write(kmsg, whole[40:])
    watch.read(CARDS)
    assert [(s.code, s.count, s.last) for s in watch.seen(CARD_3B)] == [(79, 1, BOOT + 2)]
    watch.close()


def test_continuation_and_malformed_lines_are_ignored(kmsg: Path) -> None:
    write(
        kmsg,
        " " + xid("0000:3b:00", 79) + "\n",  # a continuation line, even one reading like an Xid
        "4,1,notanumber,-;" + xid("0000:3b:00", 13) + "\n",
        "4,2;" + xid("0000:3b:00", 31) + "\n",  # too few header fields
        record(3, 3_000_000, xid("0000:3b:00", 43)),
        " DEVICE=+pci:0000:3b:00.0\n",
    )
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert [(s.code, s.count) for s in watch.seen(CARD_3B)] == [(43, 1)]
    watch.close()


# -- the log or NVML's events ---------------------------------------------------------------


def test_an_unreadable_path_takes_nvml_events(tmp_path: Path) -> None:
    watch = XidWatch(tmp_path / "no-kmsg", boot=BOOT)
    watch.read(CARDS)
    assert not watch.uses_kernel_log
    watch.nvml_events([(CARD_3B, 79), (CARD_3B, 79), (CARD_19, 48)], now=BOOT + 100)
    watch.nvml_events([(CARD_3B, 79)], now=BOOT + 200)
    assert watch.seen(CARD_3B) == [XidSeen(79, 3, BOOT + 200, xid_meaning(79)[0])]
    assert watch.seen(CARD_19) == [XidSeen(48, 1, BOOT + 100, xid_meaning(48)[0])]
    watch.read(CARDS)  # not tried again
    assert not watch.uses_kernel_log


def test_a_path_that_opens_but_cannot_be_read_falls_back(tmp_path: Path) -> None:
    watch = XidWatch(tmp_path, boot=BOOT)  # a directory: open works, read fails
    watch.read(CARDS)
    assert not watch.uses_kernel_log
    watch.nvml_events([(CARD_19, 74)], now=BOOT + 1)
    assert [(s.code, s.count) for s in watch.seen(CARD_19)] == [(74, 1)]


def test_a_readable_log_ignores_nvml_events(kmsg: Path) -> None:
    write(kmsg, record(1, 1_000_000, xid("0000:3b:00", 79)))
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    assert watch.uses_kernel_log
    watch.nvml_events([(CARD_3B, 79), (CARD_19, 48)], now=BOOT + 50)
    assert watch.seen(CARD_3B) == [XidSeen(79, 1, BOOT + 1, xid_meaning(79)[0])]
    assert watch.seen(CARD_19) == []
    watch.close()


def test_nvml_events_without_a_time_take_the_clock(tmp_path: Path) -> None:
    watch = XidWatch(tmp_path / "none", boot=BOOT)
    watch.read({})
    watch.nvml_events([(CARD_3B, 119)])
    (seen,) = watch.seen(CARD_3B)
    assert seen.code == 119 and seen.last > BOOT


def test_records_overwritten_before_read_are_skipped(
    kmsg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: list[bytes | OSError] = [
        OSError(errno.EPIPE, "Broken pipe"),  # /dev/kmsg: records lost to the ring
        record(9, 3_000_000, xid("0000:3b:00", 79)).encode(),
        BlockingIOError(errno.EAGAIN, "no more"),  # /dev/kmsg: nothing new
    ]

    def fake_read(fd: int, size: int) -> bytes:
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    watch = XidWatch(kmsg, boot=BOOT)
    monkeypatch.setattr(xidwatch_module.os, "read", fake_read)
    watch.read(CARDS)
    monkeypatch.undo()
    assert answers == []
    assert watch.uses_kernel_log
    assert [(s.code, s.last) for s in watch.seen(CARD_3B)] == [(79, BOOT + 3)]
    watch.close()


def test_close_is_safe_twice(kmsg: Path) -> None:
    watch = XidWatch(kmsg, boot=BOOT)
    watch.read(CARDS)
    watch.close()
    watch.close()


def test_boot_time_is_in_the_past() -> None:
    import time

    assert 0 < boot_time() <= time.time()
