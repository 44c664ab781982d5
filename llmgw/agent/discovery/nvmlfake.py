"""``FakeNvml``: an ``NvmlSource`` from fixed cards, for tests and benchmarks.

A figure a ``FakeCard`` does not hold answers "Not Supported", as NVML does for a figure
a driver or board cannot give; ``lost`` plays a card fallen off the bus. Tests change a
card's figures between reads with ``FakeNvml.set``, and queue Xids with ``xid``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from llmgw.agent.discovery.nvml import FIGURES, NvmlError, NvmlUnavailable

_T = TypeVar("_T")


@dataclass(frozen=True)
class FakeCard:
    """A card for FakeNvml; a None figure answers "Not Supported" as NVML would.

    ``figures`` holds the health figures by their ``FIGURES`` name, in the units
    ``NvmlSource.figure`` answers in.
    """

    uuid: str
    name: str
    memory_total: int | None = None
    memory_used: int | None = None
    utilization: int | None = None
    compute_capability: tuple[int, int] | None = None
    lost: bool = False
    figures: Mapping[str, object] = field(default_factory=dict)


class FakeNvml:
    """An NvmlSource from fixed cards, for tests. ``unavailable`` plays a CPU node."""

    def __init__(
        self,
        cards: Sequence[FakeCard] = (),
        driver: str | None = "550.54.15",
        unavailable: bool = False,
        init_error: str | None = None,
        cuda: str | None = "12.4",
    ) -> None:
        self.cards = list(cards)
        self.driver = driver
        self.cuda = cuda
        self.unavailable = unavailable
        self.init_error = init_error
        self.started = False
        self.init_calls = 0
        self.figure_calls = 0
        self._xids: list[tuple[int, int]] = []

    def init(self) -> None:
        self.init_calls += 1
        if self.unavailable:
            raise NvmlUnavailable("NVML Shared Library Not Found")
        if self.init_error:
            raise NvmlError(self.init_error)
        self.started = True

    def shutdown(self) -> None:
        self.started = False

    def set(self, index: int, **figures: object) -> None:
        """Change card ``index``'s health figures (None removes one)."""
        card = self.cards[index]
        merged = {**card.figures, **figures}
        self.cards[index] = replace(
            card, figures={k: v for k, v in merged.items() if v is not None}
        )

    def xid(self, index: int, code: int) -> None:
        """Queue an Xid on card ``index`` for the next ``xid_events``."""
        self._xids.append((index, code))

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

    def cuda_version(self) -> str:
        if not self.started:
            raise NvmlError("Uninitialized")
        return self._need(self.cuda)

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

    def figure(self, index: int, name: str) -> object:
        if name not in FIGURES:
            raise NvmlError(f"no figure {name!r}")
        self.figure_calls += 1
        return self._need(self._card(index).figures.get(name))

    def xid_events(self) -> list[tuple[int, int]]:
        if not self.started:
            raise NvmlError("Uninitialized")
        found, self._xids = self._xids, []
        return found
