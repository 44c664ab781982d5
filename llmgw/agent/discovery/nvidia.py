"""NVIDIA cards: read through NVML when it answers, else through nvidia-smi.

No NVML and no nvidia-smi means a node without NVIDIA cards: an empty list, no source,
no warning. NVML failing to start, or nvidia-smi present but failing, is a warning:
the node looks like it should have cards and cannot show them. Every warning made here
begins with "NVML:" or "nvidia-smi:", which is how ``is_gpu_warning`` tells them apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from llmgw.agent.discovery.nvidia_smi import DRIVER_FIX, run_nvidia_smi
from llmgw.agent.discovery.nvml import (
    NvmlError,
    NvmlSource,
    NvmlUnavailable,
    PynvmlSource,
    read_nvml,
)
from llmgw.wire.messages import GPU

GPU_WARNING_PREFIXES = ("NVML:", "nvidia-smi:")


def is_gpu_warning(text: str) -> bool:
    """Whether a discovery warning is about the NVIDIA driver or cards."""
    return text.startswith(GPU_WARNING_PREFIXES)


@dataclass(frozen=True)
class GpuReading:
    """One read of the cards. ``gpus`` is None when they could not be read at all.

    ``source`` is "nvml" or "nvidia-smi" for whichever gave the figures, None when
    neither did (no NVIDIA software, or it failed).
    """

    gpus: list[GPU] | None
    source: Literal["nvml", "nvidia-smi"] | None = None
    warnings: list[str] = field(default_factory=list)


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
    ) -> None:
        self._nvml: NvmlSource = nvml if nvml is not None else PynvmlSource()
        self._command = [nvidia_smi] if isinstance(nvidia_smi, str) else list(nvidia_smi)
        self._timeout = timeout
        self._state: Literal["untried", "ok", "absent", "failed"] = "untried"
        self._init_error = ""

    async def _start_nvml(self) -> None:
        try:
            await asyncio.to_thread(self._nvml.init)
        except NvmlUnavailable:
            self._state = "absent"
        except NvmlError as exc:
            self._state, self._init_error = "failed", str(exc)
        else:
            self._state = "ok"

    async def read(self, retry_nvml: bool = False) -> GpuReading:
        if self._state == "untried" or (retry_nvml and self._state != "ok"):
            await self._start_nvml()
        warnings: list[str] = []
        if self._state == "ok":
            try:
                gpus, card_warnings = await asyncio.to_thread(read_nvml, self._nvml)
            except NvmlError as exc:
                self._state, self._init_error = "failed", str(exc)
                await asyncio.to_thread(self._nvml.shutdown)
                warnings.append(
                    f"NVML: stopped answering ({exc}); reading nvidia-smi instead. "
                    f"Fix: {DRIVER_FIX}"
                )
            else:
                return GpuReading(gpus, "nvml", card_warnings)
        elif self._state == "failed":
            warnings.append(
                f"NVML: could not start ({self._init_error}); reading nvidia-smi instead. "
                f"Fix: {DRIVER_FIX}"
            )
        smi = await run_nvidia_smi(self._command, self._timeout)
        warnings += smi.warnings
        if not smi.installed:
            # No nvidia-smi: no cards, unless NVML's failure above says there are some.
            return GpuReading(None if warnings else [], None, warnings)
        return GpuReading(smi.gpus, "nvidia-smi" if smi.gpus is not None else None, warnings)

    async def close(self) -> None:
        if self._state == "ok":
            self._state = "untried"
            await asyncio.to_thread(self._nvml.shutdown)
