"""NVML behind an interface: the few calls discovery needs, the real one and a fake.

``NvmlSource`` is the seam: ``PynvmlSource`` calls the driver's library through
nvidia-ml-py (imported only when used, so a CPU node never loads it), ``FakeNvml``
stands in for it in tests, and ``read_nvml`` turns either into ``GPU`` records. Every
call blocks; the agent runs them through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from llmgw.wire.messages import GPU

_T = TypeVar("_T")


class NvmlError(Exception):
    """An NVML call failed (not supported on this card, card lost, driver fault...)."""


class NvmlUnavailable(NvmlError):
    """No NVML on this machine: no library or no driver loaded. Means "no cards"."""


class NvmlSource(Protocol):
    """The NVML calls discovery makes. Per-card calls raise NvmlError for "not read"."""

    def init(self) -> None:
        """Start NVML; NvmlUnavailable when there is none, NvmlError when it fails."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def name(self, index: int) -> str: ...

    def memory(self, index: int) -> tuple[int, int]:
        """Total and used bytes."""

    def utilization(self, index: int) -> int:
        """Percent of the last sample period a kernel ran."""

    def compute_capability(self, index: int) -> tuple[int, int]: ...


def _text(value: Any) -> str:
    # Older nvidia-ml-py releases returned bytes; newer ones decode.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PynvmlSource:
    """NVML through nvidia-ml-py's ``pynvml`` module."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlError(str(exc)) from exc

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            absent = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            if getattr(exc, "value", None) in absent:
                raise NvmlUnavailable(str(exc)) from exc
            raise NvmlError(str(exc)) from exc
        self._nvml = pynvml
        self._handles = {}

    def shutdown(self) -> None:
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            self._handles = {}
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass  # shutting down a library that is already gone is no fault

    def _handle(self, index: int) -> Any:
        if self._nvml is None:
            raise NvmlError("NVML is not started")
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def driver_version(self) -> str:
        if self._nvml is None:
            raise NvmlError("NVML is not started")
        return _text(self._call(self._nvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        if self._nvml is None:
            raise NvmlError("NVML is not started")
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def uuid(self, index: int) -> str:
        return _text(self._call(self._nvml.nvmlDeviceGetUUID, self._handle(index)))

    def name(self, index: int) -> str:
        return _text(self._call(self._nvml.nvmlDeviceGetName, self._handle(index)))

    def memory(self, index: int) -> tuple[int, int]:
        info = self._call(self._nvml.nvmlDeviceGetMemoryInfo, self._handle(index))
        return int(info.total), int(info.used)

    def utilization(self, index: int) -> int:
        rates = self._call(self._nvml.nvmlDeviceGetUtilizationRates, self._handle(index))
        return int(rates.gpu)

    def compute_capability(self, index: int) -> tuple[int, int]:
        major, minor = self._call(
            self._nvml.nvmlDeviceGetCudaComputeCapability, self._handle(index)
        )
        return int(major), int(minor)


@dataclass(frozen=True)
class FakeCard:
    """A card for FakeNvml; a None figure answers "Not Supported" as NVML would."""

    uuid: str
    name: str
    memory_total: int | None = None
    memory_used: int | None = None
    utilization: int | None = None
    compute_capability: tuple[int, int] | None = None
    lost: bool = False


class FakeNvml:
    """An NvmlSource from fixed cards, for tests. ``unavailable`` plays a CPU node."""

    def __init__(
        self,
        cards: Sequence[FakeCard] = (),
        driver: str | None = "550.54.15",
        unavailable: bool = False,
        init_error: str | None = None,
    ) -> None:
        self.cards = list(cards)
        self.driver = driver
        self.unavailable = unavailable
        self.init_error = init_error
        self.started = False
        self.init_calls = 0

    def init(self) -> None:
        self.init_calls += 1
        if self.unavailable:
            raise NvmlUnavailable("NVML Shared Library Not Found")
        if self.init_error:
            raise NvmlError(self.init_error)
        self.started = True

    def shutdown(self) -> None:
        self.started = False

    def _card(self, index: int) -> FakeCard:
        if not self.started:
            raise NvmlError("Uninitialized")
        card = self.cards[index]
        if card.lost:
            raise NvmlError("GPU is lost")
        return card

    @staticmethod
    def _need(value: _T | None) -> _T:
        if value is None:
            raise NvmlError("Not Supported")
        return value

    def driver_version(self) -> str:
        if not self.started:
            raise NvmlError("Uninitialized")
        return self._need(self.driver)

    def device_count(self) -> int:
        if not self.started:
            raise NvmlError("Uninitialized")
        return len(self.cards)

    def uuid(self, index: int) -> str:
        return self._card(index).uuid

    def name(self, index: int) -> str:
        return self._card(index).name

    def memory(self, index: int) -> tuple[int, int]:
        card = self._card(index)
        return self._need(card.memory_total), self._need(card.memory_used)

    def utilization(self, index: int) -> int:
        return self._need(self._card(index).utilization)

    def compute_capability(self, index: int) -> tuple[int, int]:
        return self._need(self._card(index).compute_capability)


def _maybe(call: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return call(*args)
    except NvmlError:
        return None


def read_nvml(source: NvmlSource) -> tuple[list[GPU], list[str]]:
    """The cards NVML sees, and a warning per card it could not read.

    A figure NVML will not give (MIG mode hides utilisation, some boards hide memory) is
    absent. The count failing raises NvmlError: then NVML as a whole is not answering.
    """
    driver = _maybe(source.driver_version)
    gpus: list[GPU] = []
    warnings: list[str] = []
    for i in range(source.device_count()):
        try:
            uuid, name = source.uuid(i), source.name(i)
        except NvmlError as exc:
            warnings.append(
                f"NVML: card {i} could not be read ({exc}). Fix: look for Xid errors in "
                "`dmesg`; a card that fell off the bus needs a reset or a reboot"
            )
            continue
        memory = _maybe(source.memory, i)
        cc = _maybe(source.compute_capability, i)
        gpus.append(
            GPU(
                index=i,
                uuid=uuid,
                name=name,
                memory_total=memory[0] if memory else None,
                memory_used=memory[1] if memory else None,
                utilization=_maybe(source.utilization, i),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                driver=driver,
            )
        )
    return gpus, warnings
