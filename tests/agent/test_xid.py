"""Xid reports in kernel logs: every prefix the log readers add, and what the codes mean."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.discovery.xid import (
    XID_MEANINGS,
    XidEvent,
    parse_xid_line,
    parse_xid_lines,
    xid_meaning,
)

XID = Path(__file__).parent / "fixtures" / "xid"


def read(name: str) -> list[XidEvent]:
    return parse_xid_lines((XID / name).read_text())


def test_xid_79_with_monotonic_stamp() -> None:
    events = read("dmesg_Xid-79-62_monotonic.txt")
    assert [e.code for e in events] == [62, 79]
    assert events[1] == XidEvent(
        pci="0000:19:00",
        code=79,
        pid=4021,
        process="python3",
        text="GPU has fallen off the bus.",
        at="86400.118283",
    )


def test_xid_without_pid_keeps_the_words() -> None:
    xid62 = read("dmesg_Xid-79-62_monotonic.txt")[0]
    assert (xid62.pci, xid62.pid, xid62.process) == ("0000:3b:00", None, None)
    assert xid62.text.startswith("322bff9a 0000b3b8 ")
    assert xid62.at == "8123.004512"


def test_dmesg_T_gsp_timeout_ignores_the_rpc_history() -> None:
    events = read("dmesg-T_Xid-119_GSP-timeout.txt")
    assert [e.code for e in events] == [119, 119, 154]
    first = events[0]
    assert first.pci == "0000:9b:00"
    assert (first.pid, first.process) == (51877, "nvidia-smi")
    assert first.at == "Mon Mar 10 09:12:41 2025"
    assert first.text.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    recovery = events[2]
    assert (recovery.pid, recovery.process) == (None, None)
    assert recovery.text == (
        "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    )


def test_iso_stamps_and_unknown_process() -> None:
    events = read("dmesg-iso_Xid-48-63-94.txt")
    assert [e.code for e in events] == [48, 63, 94, 94, 94]
    dbe = events[0]
    assert dbe.pci == "0000:cb:00"
    assert dbe.pid is None  # pid='<unknown>'
    assert dbe.process is None  # name=<unknown>
    assert dbe.at == "2025-04-02T03:18:20,470068+00:00"
    assert dbe.text.startswith("An uncorrectable double bit error (DBE)")
    assert (events[3].pid, events[3].process, events[3].text) == (
        771204,
        "pt_main_thread",
        "Ch 00000008",
    )


def test_dmesg_decode_prefix() -> None:
    events = read("dmesg-decode-iso_Xid-13-43.txt")
    assert [e.code for e in events] == [13, 13, 43]
    assert events[0].at == "2025-05-20T14:41:44,283302+00:00"
    assert events[0].text == (
        "Graphics SM Warp Exception on (GPC 9, TPC 1, SM 1): Out Of Range Address"
    )
    assert (events[2].pid, events[2].process) == (2924364, "pt_main_thread")


def test_journald_prefixes() -> None:
    events = read("journalctl-k_Xid-74-31.txt")
    assert [e.code for e in events] == [74, 31, 45]  # the NVSwitch SXid is not an Xid
    nvlink, fault, cleanup = events
    assert (nvlink.pci, nvlink.pid, nvlink.process) == ("0000:9b:00", 90211, "python")
    assert nvlink.at == "Jun 07 22:14:03"
    assert nvlink.text.startswith("NVLink: fatal error detected on link 3")
    assert fault.at == "Jun  8 01:30:17"  # wall clock over seconds since boot
    assert fault.process == "vllm-worker"
    assert fault.text.startswith("Ch 00000010, intr 00000000. MMU Fault:")
    assert cleanup.at == "2025-06-08T02:00:00+0000"


def test_bare_line_has_no_time() -> None:
    event = parse_xid_line("NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus.")
    assert event is not None
    assert (event.code, event.pid, event.at) == (79, None, None)
    assert event.text == "GPU has fallen off the bus."


def test_other_lines_are_ignored() -> None:
    assert parse_xid_lines("") == []
    assert parse_xid_line("NVRM: GPU at PCI:0000:9b:00: GPU-7a3e10c4") is None
    assert parse_xid_line("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal") is None


def test_meanings_cover_the_common_codes() -> None:
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120):
        meaning, action = XID_MEANINGS[code]
        assert meaning and action
        assert xid_meaning(code) == (meaning, action)
    assert "fallen off the bus" in XID_MEANINGS[79][0]


def test_unknown_code_gets_a_generic_meaning() -> None:
    meaning, action = xid_meaning(99999)
    assert "Xid" in meaning
    assert "catalogue" in action
