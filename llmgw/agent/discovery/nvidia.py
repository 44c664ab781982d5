"""NVIDIA cards: read through NVML when it answers, else through nvidia-smi.

No NVML and no nvidia-smi means a node without NVIDIA cards: an empty list, no source,
no warning. NVML failing to start, or nvidia-smi present but failing, is a warning:
the node looks like it should have cards and cannot show them. Every warning made here
begins with "NVML:" or "nvidia-smi:", which is how ``is_gpu_warning`` tells them apart.

Through nvidia-smi, ``-q -x`` gives every figure in one run (the plain ``-q`` where the
XML cannot be had, then ``--query-gpu`` with every health field and a header); a build
that gives none of those (or a wrapper that answers only the agent's plain CSV query) is
read through the eight-field ``--query-gpu`` instead. NVLink
is not in ``-q -x``: a slow read also runs ``nvidia-smi nvlink -s`` and ``nvlink -e``, and
the reads between slow ones repeat what those gave (so their health records do not
change for want of it). Xids come from the kernel log, or from NVML's events where the
log cannot be read (``XidWatch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from llmgw.agent.discovery.cardread import from_smi_xml, read_nvml, read_nvml_health
from llmgw.agent.discovery.mig import merge_instances, parse_mig_xml, parse_smi_list
from llmgw.agent.discovery.nvidia_smi import (
    DRIVER_FIX,
    MIG_UNLISTED,
    run_nvidia_smi,
    run_nvidia_smi_full_csv,
    run_nvidia_smi_list,
    run_nvidia_smi_nvlink_errors,
    run_nvidia_smi_nvlink_status,
    run_nvidia_smi_xml,
)
from llmgw.agent.discovery.nvlinktext import card_key, nvlink_health
from llmgw.agent.discovery.nvml import (
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
    PynvmlSource,
)
from llmgw.agent.discovery.smixml import SmiXml
from llmgw.agent.discovery.xidwatch import XidWatch
from llmgw.wire.hardware import GPU, GpuHealth

GPU_WARNING_PREFIXES = ("NVML:", "nvidia-smi:")


def is_gpu_warning(text: str) -> bool:
    """Whether a discovery warning is about the NVIDIA driver or cards."""
    return text.startswith(GPU_WARNING_PREFIXES)


@dataclass(frozen=True)
class GpuReading:
    """One read of the cards. ``gpus`` is None when they could not be read at all.

    ``source`` is "nvml" or "nvidia-smi" for whichever gave the figures, None when
    neither did (no NVIDIA software, or it failed). ``health`` holds the slow figures
    when they were asked for and could be read.
    """

    gpus: list[GPU] | None
    source: Literal["nvml", "nvidia-smi"] | None = None
    warnings: list[str] = field(default_factory=list)
    health: list[GpuHealth] | None = None
    cuda_version: str | None = None


class NvidiaCards:
    """The node's NVIDIA cards, NVML started once and kept open between reads.

    NVML's start can take seconds on a card without persistence mode, so it is not
    repeated per heartbeat; a full scan (``retry_nvml=True``) tries again if it failed.
    """

    def __init__(
        self,
        nvml: NvmlSource | None = None,
        nvidia_smi: str | Sequence[str] = "nvidia-smi",
        timeout: float = 10.0,
        xids: XidWatch | None = None,
    ) -> None:
        self._nvml: NvmlSource = nvml if nvml is not None else PynvmlSource()
        self._command = [nvidia_smi] if isinstance(nvidia_smi, str) else list(nvidia_smi)
        self._timeout = timeout
        self._state: Literal["untried", "ok", "absent", "failed"] = "untried"
        self._init_error = ""
        # False once nvidia-smi answered only the CSV query, or is not there at all.
        self._xml = True
        # Per card key (nvlinktext.card_key): (links, active, counters) from the last
        # slow read through nvidia-smi.
        self._nvlink: dict[str, tuple[int, int, dict[str, int] | None]] = {}
        self.xids = xids if xids is not None else XidWatch()
        self._nvml_call: asyncio.Future[GpuReading] | None = None

    async def _nvml_read(self, slow: bool) -> GpuReading:
        """NVML's read in a worker thread. A read whose caller stopped waiting (its
        collector's deadline) is waited on again, not doubled: a thread stuck in the
        driver cannot be stopped, and one more per read would pile up."""
        call = self._nvml_call
        if call is None or call.done():
            call = self._nvml_call = asyncio.ensure_future(asyncio.to_thread(self._read_nvml, slow))
        return await asyncio.shield(call)

    @property
    def tool(self) -> str:
        """What the cards are read through now, as warnings name it."""
        return "NVML" if self._state == "ok" else "nvidia-smi"

    async def _start_nvml(self) -> None:
        try:
            await asyncio.to_thread(self._nvml.init)
        except NvmlUnavailable:
            self._state = "absent"
        except NvmlError as exc:
            self._state, self._init_error = "failed", str(exc)
        else:
            self._state = "ok"

    def _read_nvml(self, slow: bool) -> GpuReading:
        """In a worker thread: the cards, their Xids, and the slow figures if asked."""
        gpus, warnings = read_nvml(self._nvml)
        by_index = {g.index: g.mig_parent or g.uuid for g in gpus}
        try:
            events = self._nvml.xid_events()
        except NvmlError:
            events = []
        self._note_xids(gpus)
        self.xids.nvml_events((by_index.get(i, f"index-{i}"), code) for i, code in events)
        if not slow:
            return GpuReading(gpus, "nvml", warnings)
        health = self._with_xids(read_nvml_health(self._nvml, self._nvml.device_count()))
        try:
            cuda: str | None = self._nvml.cuda_version()
        except NvmlError:
            cuda = None
        return GpuReading(gpus, "nvml", warnings, health, cuda)

    def _note_xids(self, gpus: list[GPU]) -> None:
        self.xids.read({g.bus_id: g.mig_parent or g.uuid for g in gpus if g.bus_id})

    def _with_xids(self, health: list[GpuHealth]) -> list[GpuHealth]:
        return [replace(h, xids=self.xids.seen(h.uuid)) for h in health]

    async def _read_nvlink(self) -> dict[str, tuple[int, int, dict[str, int] | None]]:
        """NVLink through nvidia-smi; nothing (and no ``-e`` run) when ``-s`` fails."""
        status = await run_nvidia_smi_nvlink_status(self._command, self._timeout)
        if status is None:
            return {}
        errors = await run_nvidia_smi_nvlink_errors(self._command, self._timeout)
        return nvlink_health(status, errors)

    def _with_nvlink(self, health: list[GpuHealth]) -> list[GpuHealth]:
        # A header without a UUID gives nvidia-smi's index, which is the card's place in
        # -q -x (the health records' order), not its minor number (GpuHealth.index).
        out = []
        for position, h in enumerate(health):
            found = self._nvlink.get(h.uuid) or self._nvlink.get(card_key(None, position))
            if found is not None:
                links, active, errors = found
                h = replace(h, nvlink_links=links, nvlink_active=active, nvlink_errors=errors)
            out.append(h)
        return out

    async def _mig(self, log: SmiXml, text: str | None) -> dict[str, list[GPU]] | None:
        """Each MIG-mode card's instances, from ``-L`` (their UUIDs and profiles) joined
        with ``-q -x`` (their memory; none when only the plain ``-q`` was read); None
        when ``-L`` failed (what the cards hold is not known)."""
        if not any(c.mig_mode_current == "Enabled" for c in log.cards):
            return {}
        listed = await run_nvidia_smi_list(self._command, self._timeout)
        if listed is None:
            return None
        names = {c.uuid: (c.name or "", c.memory_total_bytes) for c in log.cards}
        found: dict[str, list[GPU]] = {}
        merged = merge_instances(parse_smi_list(listed), parse_mig_xml(text) if text else {})
        for parent, instances in merged.items():
            name, memory = names.get(parent, ("", None))
            found[parent] = [
                GPU(
                    index=i.parent_index,
                    uuid=i.uuid,
                    name=name,
                    memory_total=i.memory_total,
                    mig_mode=True,
                    mig_parent=parent,
                    mig_profile=i.profile,
                    mig_class=i.class_name(name, memory),
                )
                for i in instances
                if i.uuid
            ]
        return found

    async def read(self, retry_nvml: bool = False, slow: bool = False) -> GpuReading:
        if self._state == "untried" or (retry_nvml and self._state != "ok"):
            await self._start_nvml()
        if retry_nvml:
            self._xml = True
        warnings: list[str] = []
        if self._state == "ok":
            try:
                return await self._nvml_read(slow)
            except NvmlError as exc:
                self._state, self._init_error = "failed", str(exc)
                await asyncio.to_thread(self._nvml.shutdown)
                warnings.append(
                    f"NVML: stopped answering ({exc}); reading nvidia-smi instead. "
                    f"Fix: {DRIVER_FIX}"
                )
        elif self._state == "failed":
            warnings.append(
                f"NVML: could not start ({self._init_error}); reading nvidia-smi instead. "
                f"Fix: {DRIVER_FIX}"
            )
        if self._xml:
            read = await run_nvidia_smi_xml(self._command, self._timeout)
            if read is not None:
                log, text = read
                mig = await self._mig(log, text)
                if mig is None:
                    warnings.append(f"{MIG_UNLISTED}. Fix: {DRIVER_FIX}")
                gpus, health = from_smi_xml(log, mig or {})
                await asyncio.to_thread(self._note_xids, gpus)
                if slow:
                    self._nvlink = await self._read_nvlink()
                return GpuReading(
                    gpus,
                    "nvidia-smi",
                    warnings,
                    # -q -x reads them anyway: given every time, sent when they change.
                    self._with_xids(self._with_nvlink(health)),
                    log.cuda_version if slow else None,
                )
            full = await run_nvidia_smi_full_csv(self._command, self._timeout)
            if full is not None:
                gpus, health = full
                await asyncio.to_thread(self._note_xids, gpus)
                return GpuReading(gpus, "nvidia-smi", warnings, self._with_xids(health))
        smi = await run_nvidia_smi(self._command, self._timeout)
        warnings += smi.warnings
        if not smi.installed:
            # No nvidia-smi: no cards, unless NVML's failure above says there are some.
            # Its other forms are not tried again until a full scan (a CPU node's beats).
            self._xml = False
            return GpuReading(None if warnings else [], None, warnings)
        if smi.gpus is not None:
            self._xml = False  # it answers the query but not -q -x: stop asking
        return GpuReading(smi.gpus, "nvidia-smi" if smi.gpus is not None else None, warnings)

    async def close(self) -> None:
        if self._state == "ok":
            self._state = "untried"
            await asyncio.to_thread(self._nvml.shutdown)
        self.xids.close()
