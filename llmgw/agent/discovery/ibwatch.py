"""A node's InfiniBand and RoCE ports for its heartbeats: read every time (their state
and counters move), with the master subnet manager each active InfiniBand port sees
asked of ``sminfo`` once a minute and carried on the ports in between.

No RDMA device, no sysfs class and no tools mean no ports: an empty list, never a
failed discovery.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

from llmgw.agent import command
from llmgw.agent.discovery.infiniband import SmInfo, normalise_guid, read_ports, read_sminfo
from llmgw.wire.hardware import IbPort

SM_EVERY = 60.0
SM_STATES = {0: "NOTACTIVE", 1: "DISCOVERING", 2: "STANDBY", 3: "MASTER"}
_SMIR_FIELD = re.compile(r"^\s*(?P<key>LID|GUID|ActCount|Priority|SMState)\.+\s*(?P<value>\S+)")


class SubnetManager(TypedDict):
    """One record of ``saquery SMIR``."""

    guid: str | None  # None when zero or not hex
    lid: int | None
    priority: int | None
    state: str  # MASTER, STANDBY, DISCOVERING, NOTACTIVE, or the number when unknown
    activity: int | None


def parse_smir(text: str) -> list[SubnetManager]:
    """``saquery SMIR``: every subnet manager the fabric's SA knows, as
    ``{"guid", "lid", "priority", "state", "activity"}`` (state as a word: MASTER,
    STANDBY, ...). Records missing their GUID or state are left out."""
    found: list[SubnetManager] = []
    record: dict[str, str] = {}

    def close() -> None:
        if "GUID" in record and "SMState" in record:
            state = record["SMState"]
            number = int(state) if state.isdigit() else None
            found.append(
                {
                    "guid": normalise_guid(record["GUID"]),
                    "lid": _int(record.get("LID")),
                    "priority": _int(record.get("Priority")),
                    "state": SM_STATES.get(number, state) if number is not None else state,
                    "activity": _int(record.get("ActCount")),
                }
            )

    for line in text.splitlines():
        if line.startswith("SMInfoRecord dump"):
            close()
            record = {}
        elif m := _SMIR_FIELD.match(line):
            record[m["key"]] = m["value"]
    close()
    return found


def _int(value: str | None) -> int | None:
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


class PortWatch:
    def __init__(
        self,
        root: Path = Path("/"),
        *,
        ibstat: str | None = "ibstat",
        sminfo: str = "sminfo",
        sm_every: float = SM_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.ibstat = ibstat
        self.sminfo = sminfo
        self.sm_every = sm_every
        self.clock = clock
        self._sm_at = float("-inf")
        self._masters: dict[tuple[str, int], SmInfo] = {}

    async def read(self) -> list[IbPort]:
        ports = await read_ports(self.root, ibstat=self.ibstat)
        now = self.clock()
        if ports and now - self._sm_at >= self.sm_every:
            self._sm_at = now
            masters: dict[tuple[str, int], SmInfo] = {}
            for p in ports:
                # A port the SM has not brought up yet (INIT, ARMED) still sees it.
                if p.link_layer == "InfiniBand" and p.state in ("ACTIVE", "ARMED", "INIT"):
                    info = await read_sminfo(p.device, p.port, sminfo=self.sminfo)
                    if info is not None:
                        masters[(p.device, p.port)] = info
            self._masters = masters
        return [self._with_master(p) for p in ports]

    def _with_master(self, port: IbPort) -> IbPort:
        seen = self._masters.get((port.device, port.port))
        if seen is None:
            return port
        return replace(port, master_sm_guid=seen.sm_guid, master_sm_lid=seen.sm_lid)


async def run_ibnetdiscover(
    device: str | None = None,
    port: int | None = None,
    *,
    tool: str = "ibnetdiscover",
    timeout: float = 120.0,
    extra: tuple[str, ...] = (),
) -> str:
    """``ibnetdiscover`` over ``device``/``port`` (the fabric it is on): its whole output,
    for the control plane to parse. RuntimeError with the tool's words when it fails.
    (``saquery`` takes the same ``-C``/``-P``: ``tool="saquery", extra=("SMIR",)``.)"""
    argv = [tool]
    if device:
        argv += ["-C", device]
    if port:
        argv += ["-P", str(port)]
    argv += extra
    try:
        done = await command.run(argv, timeout, stderr="apart")
    except TimeoutError:  # before OSError, of which it is one
        raise RuntimeError(f"{tool} did not finish in {timeout:.0f} s") from None
    except OSError as exc:
        raise RuntimeError(f"{tool} cannot be run: {exc.strerror or exc}") from exc
    if done.code != 0:
        words = done.err.strip().splitlines()[-3:]
        raise RuntimeError(f"{tool} failed (exit {done.code}): {' | '.join(words)}")
    return done.out
