"""One heartbeat of a node with 8 cards through the control plane, in one process: the
frame unpacked, decoded, made whole and taken by the registry, side by side with the
ways it was done before, in one run. Quieter than ``bench/agents.py`` on a shared
machine: no sockets, no TLS, no other process; it times only what the control plane does
with a heartbeat's bytes once they are read.

Rows (microseconds per heartbeat, the best of ``--repeat`` rounds, the rows taking turns):

- ``unpack``: msgpack of the frame (``FrameDecoder.feed``), whole cards and figures alone;
- ``decode``: ``from_map`` (the generic, field by field: the baseline) against the
  decoder written per class (``codec.decoder``), whole cards and figures alone;
- ``whole``: figures laid over the stream's last cards (``NodeStream``'s part);
- ``registry``: ``NodeRegistry.heartbeat`` (live figures, energy, the hour's history);
- ``all``: frame to registry, whole cards with ``from_map`` (before issue 33) against
  figures alone with the written decoder (now).

    .venv/bin/python bench/heartbeat.py --nodes 200 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents import SimFacts  # noqa: E402

from llmgw.server.fleet.nodeview import NodeView  # noqa: E402
from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks  # noqa: E402
from llmgw.wire.codec import decoder, from_map, merged  # noqa: E402
from llmgw.wire.framing import FrameDecoder  # noqa: E402
from llmgw.wire.hardware import GPU, gpu_figures, with_figures  # noqa: E402
from llmgw.wire.messages import Heartbeat, encode_message  # noqa: E402


def frames(beats: int) -> tuple[list[bytes], list[bytes], list[GPU]]:
    """``beats`` heartbeats of one node, each with whole cards and with figures alone
    (the health a minute apart, as a real agent's), and its cards at registering."""
    source = SimFacts(8, 12)
    whole: list[bytes] = []
    figures: list[bytes] = []
    for seq in range(beats):
        live = source.next_live()
        assert live.gpus is not None
        common: dict[str, Any] = {
            "seq": seq,
            "memory_available": live.memory_available,
            "cpu_percent": live.cpu_percent,
            "load": live.load,
            "disks": live.disks,
            "gpu_health": live.gpu_health,
            "vitals": live.vitals,
        }
        whole.append(encode_message(Heartbeat(gpus=live.gpus, **common)))
        moving = [gpu_figures(card) for card in live.gpus]
        figures.append(encode_message(Heartbeat(gpu_figures=moving, **common)))
    return whole, figures, source.gpus


Timed = tuple[int, Callable[[], object]]  # items a run, and the run


def best(rounds: int, rows: list[tuple[str, Timed]]) -> list[tuple[str, float]]:
    """Microseconds per item of each row: the best of ``rounds`` runs, the rows taking
    turns within each round, so that what else the machine does falls on all alike."""
    times: dict[str, float] = {}
    for _ in range(rounds):
        for name, (per, run) in rows:
            t0 = time.perf_counter()
            run()
            us = (time.perf_counter() - t0) / per * 1e6
            times[name] = min(us, times.get(name, us))
    return [(name, times[name]) for name, _ in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=200, help="nodes in the registry")
    p.add_argument("--beats", type=int, default=24, help="distinct heartbeats a node")
    p.add_argument("--repeat", type=int, default=5, help="rounds; the best is shown")
    args = p.parse_args(argv)
    whole, figures, cards = frames(args.beats)
    unpack = FrameDecoder().feed
    whole_maps = [unpack(f)[0] for f in whole]
    figure_maps = [unpack(f)[0] for f in figures]
    fast = decoder(Heartbeat)
    hooks = RegistryHooks(changed=lambda: None, kv_blocks=lambda *_: None)
    reg = NodeRegistry(None, heartbeat_interval=5.0, missed_heartbeats=3, hooks=hooks)  # type: ignore[arg-type]
    facts = asyncio.run(SimFacts(8, 12).facts("node"))
    ids = [f"n{i}" for i in range(args.nodes)]
    for node in ids:
        reg.nodes[node] = NodeView(id=node, cert_serial=1, facts=facts)
    decoded = [fast(m) for m in whole_maps]
    figure_beats = [fast(m) for m in figure_maps]
    per = len(whole)

    def over(items: list[Any], work: Callable[[Any], object]) -> Timed:
        return per * 20, lambda: [work(m) for _ in range(20) for m in items]

    def unpacking(frame_list: list[bytes]) -> Timed:
        return per * 20, lambda: [unpack(f) for _ in range(20) for f in frame_list]

    def whole_of(beat: Heartbeat) -> Heartbeat:
        """As ``NodeStream`` makes a heartbeat of figures whole."""
        assert beat.gpu_figures is not None
        gpus = [with_figures(c, f) for c, f in zip(cards, beat.gpu_figures, strict=True)]
        return merged(beat, {"gpus": gpus, "gpu_figures": None})

    def registry_round() -> None:
        for i, node in enumerate(ids):
            reg.heartbeat(node, decoded[i % per])

    def path(frame_list: list[bytes], make: Callable[[bytes], Heartbeat]) -> Timed:
        def run() -> None:
            for i, node in enumerate(ids):
                reg.heartbeat(node, make(frame_list[i % per]))

        return len(ids), run

    rows = [
        ("unpack, whole cards", unpacking(whole)),
        ("unpack, figures alone", unpacking(figures)),
        (
            "decode whole cards: from_map (baseline)",
            over(whole_maps, lambda m: from_map(Heartbeat, m)),
        ),
        ("decode whole cards: written decoder", over(whole_maps, fast)),
        ("decode figures alone: written decoder", over(figure_maps, fast)),
        ("figures laid over the last cards", over(figure_beats, whole_of)),
        ("registry.heartbeat", (len(ids), registry_round)),
        (
            "all: whole cards, from_map (before)",
            path(whole, lambda f: from_map(Heartbeat, unpack(f)[0])),
        ),
        (
            "all: figures alone, written decoder (now)",
            path(figures, lambda f: whole_of(fast(unpack(f)[0]))),
        ),
    ]
    print(
        f"one heartbeat of a node with 8 cards, every figure: frame {len(whole[1]):,} bytes "
        f"whole, {len(figures[1]):,} with figures alone; {args.nodes} nodes, best of "
        f"{args.repeat}; Python {sys.version.split()[0]}"
    )
    for name, us in best(args.repeat, rows):
        print(f"  {name:<44} {us:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
