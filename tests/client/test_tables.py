"""ctl's tables: absent figures are a dash, shared disks left out of a node's own."""

from __future__ import annotations

from llmgw.client.tables import ago, local_disk, nodes_table, status_text


def test_nodes_table_shows_dashes_for_unknowns() -> None:
    nodes = [
        {
            "id": "gpu01",
            "state": "Ready",
            "address": "10.0.0.2",
            "cpu_count": 64,
            "cpu_percent": 12.4,
            "load": [1.5, 1.0, 0.5],
            "memory_total": 512 * 2**30,
            "memory_available": 256 * 2**30,
            "disks": [
                {"path": "/", "total": 100 * 2**30, "free": 40 * 2**30, "shared": False},
                {"path": "/nfs", "total": 10**13, "free": 10**12, "shared": True},
            ],
            "gpus": [{"name": "NVIDIA H100"}, {"name": "NVIDIA H100"}],
            "last_seen": None,
        },
        {"id": "new", "state": "NotReady", "gpus": []},
    ]
    lines = nodes_table(nodes).splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "ADDRESS"]
    row = lines[1].split()
    assert row[:6] == ["gpu01", "Ready", "10.0.0.2", "64", "12%", "1.50"]
    assert "256.0/512.0" in lines[1] and "40.0/100.0" in lines[1]
    assert "2 NVIDIA H100" in lines[1]
    assert lines[2].split() == ["new", "NotReady", "-", "-", "-", "-", "-", "-", "0", "0", "-"]


def test_nodes_table_lists_each_warning_with_its_fix() -> None:
    pcie = "pcie: card 3 (NVIDIA H100) runs at x8 Gen4: 15.8 GB/s of 31.5. Fix: reseat it"
    nodes = [
        {"id": "gpu01", "state": "Ready", "gpus": [{"name": "NVIDIA H100"}], "warnings": [pcie]},
        {"id": "gpu02", "state": "Ready", "gpus": [], "warnings": []},
    ]
    text = nodes_table(nodes)
    lines = text.splitlines()
    assert lines[0].split()[-2:] == ["WARN", "SEEN"]
    assert lines[1].split()[-2] == "1" and lines[2].split()[-2] == "0"
    assert text.endswith(f"Warnings:\ngpu01: {pcie}")
    assert "Warnings" not in nodes_table(nodes[1:])


def test_empty_cluster_says_how_to_add_a_node() -> None:
    assert "llmgw node add" in nodes_table([])


def test_local_disk() -> None:
    assert local_disk(None) is None
    assert local_disk([{"shared": True, "free": 1, "total": 2}]) is None
    assert local_disk([{"free": 1, "total": 2}, {"free": 3, "total": 4}]) == (4, 6)


def test_ago_and_status() -> None:
    assert ago(None) == "-" and ago(100, now=130) == "30s" and ago(0, now=7200) == "2h"
    text = status_text(
        {
            "version": "0.1",
            "uptime_seconds": 5,
            "nodes": {"total": 2, "ready": 1, "not_ready": 1},
            "heartbeat_handling": {"p99_ms": 0.2},
        }
    )
    assert "1 Ready of 2 (1 NotReady)" in text and "p99 0.2 ms" in text


def test_replicas_table_shows_download_and_failure_lines() -> None:
    from llmgw.client.tables import replicas_table

    rows = [
        {
            "replica_id": "r1",
            "node": "gpu01",
            "state": "downloading",
            "engine": "llama.cpp",
            "port": 9001,
            "pid": None,
            "backend": None,
            "devices": [],
            "offloaded_layers": None,
            "rss": None,
            "download": {
                "source": "hf:o/r:Q4_K_M",
                "file": "r-Q4_K_M.gguf",
                "done": 2_500_000,
                "total": None,
            },
        },
        {
            "replica_id": "r2",
            "node": "gpu01",
            "state": "ready",
            "engine": "llama.cpp",
            "port": 9002,
            "pid": 4242,
            "backend": "CUDA",
            "devices": ["CUDA0 (NVIDIA H100)"],
            "offloaded_layers": 33,
            "total_layers": 33,
            "rss": 1_200_000_000,
            "download": None,
        },
        {
            "replica_id": "r3",
            "node": "cpu01",
            "state": "failed",
            "engine": "llama.cpp",
            "port": 9003,
            "pid": None,
            "rss": None,
            "download": None,
            "reason": "the engine exited (code 1)",
        },
    ]
    rows[1].update(model="qwen", cards=["GPU-5d2f7c1a-0000-0000-0000-000000000000"])
    lines = replicas_table(rows).splitlines()
    assert lines[0].split()[:6] == ["REPLICA", "MODEL", "NODE", "STATE", "ENGINE", "CARDS"]
    assert lines[3].split()[:6] == ["r2", "qwen", "gpu01", "ready", "llama.cpp", "GPU-5d2f7c1a"]
    # No total from the server: bytes so far, and no invented percentage.
    assert lines[2].strip() == "downloading r-Q4_K_M.gguf: 2.5 MB so far"
    assert "CUDA 33/33 layers CUDA0 (NVIDIA H100)" in lines[3] and "1.2 GB" in lines[3]
    assert lines[5].strip() == "the engine exited (code 1)"


def test_nodes_table_says_cordoned_and_draining() -> None:
    from llmgw.client.tables import nodes_table

    nodes = [
        {"id": "a", "state": "Ready", "cordoned": True, "draining": False},
        {"id": "b", "state": "NotReady", "cordoned": True, "draining": True},
        {"id": "c", "state": "Ready"},
    ]
    states = [line.split()[1] for line in nodes_table(nodes).splitlines()[1:]]
    assert states == ["Ready,Cordoned", "NotReady,Draining", "Ready"]
