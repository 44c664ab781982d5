"""nvidia-smi topo -m: the matrix, the attribute columns, the NIC legend, the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.topology import TopologyFormatError, parse_topo

TOPO = Path(__file__).parent / "fixtures" / "topo"


def read(name: str) -> str:
    return (TOPO / name).read_text()


def test_8xh100_nvlink_matrix() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_8xH100-NV18_8NIC.txt"))
    assert [c.name for c in topo.cards] == [f"GPU{i}" for i in range(8)]
    gpu0 = topo.cards[0]
    assert gpu0.index == 0
    assert gpu0.links["GPU1"] == "NV18"
    assert "GPU0" not in gpu0.links
    assert len(gpu0.links) == 15
    assert gpu0.nvlink_peers == tuple(f"GPU{i}" for i in range(1, 8))
    assert gpu0.cpu_affinity == "0-51,104-155"
    assert gpu0.numa == 0
    assert gpu0.gpu_numa_id is None
    gpu5 = topo.card("GPU5")
    assert gpu5 is not None
    assert (gpu5.cpu_affinity, gpu5.numa) == ("52-103,156-207", 1)
    assert gpu5.links["NIC5"] == "PIX"
    assert gpu5.links["NIC4"] == "NODE"
    assert gpu5.links["NIC0"] == "SYS"


def test_8xh100_nics_and_legend() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_8xH100-NV18_8NIC.txt"))
    assert topo.nics == [f"NIC{i}" for i in range(8)]
    assert topo.nic_devices["NIC0"] == "mlx5_0"
    assert topo.nic_devices["NIC7"] == "mlx5_7"
    assert topo.nic_distance("GPU0", "NIC0") == "PIX"
    assert topo.nic_distance(0, "mlx5_0") == "PIX"
    assert topo.nic_distance(0, "mlx5_1") == "NODE"
    assert topo.nic_distance(7, "NIC0") == "SYS"
    assert topo.nic_column("mlx5_3") == "NIC3"


def test_nic_distance_unknown_is_none() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_8xH100-NV18_8NIC.txt"))
    assert topo.nic_distance("GPU8", "NIC0") is None
    assert topo.nic_distance(0, "mlx5_9") is None
    assert topo.card(9) is None


def test_pcie_only_has_no_nvlink_peers() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_4xRTX6000Ada-PCIe-only_2NIC.txt"))
    assert len(topo.cards) == 4
    assert all(c.nvlink_peers == () for c in topo.cards)
    gpu0, gpu1, gpu2, gpu3 = topo.cards
    assert gpu0.links == {
        "GPU1": "PXB",
        "GPU2": "SYS",
        "GPU3": "SYS",
        "NIC0": "PXB",
        "NIC1": "SYS",
    }
    assert gpu2.links["GPU3"] == "PHB"
    assert (gpu1.cpu_affinity, gpu1.numa) == ("0-23", 0)
    assert (gpu3.cpu_affinity, gpu3.numa) == ("24-47", 1)
    assert topo.nics == ["NIC0", "NIC1"]
    assert topo.nic_devices == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo.nic_distance(3, "mlx5_1") == "NODE"


def test_raw_ansi_two_cards() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_2xH200-VM_raw-ansi.txt"))
    assert [c.name for c in topo.cards] == ["GPU0", "GPU1"]
    gpu0, gpu1 = topo.cards
    assert gpu0.links == {"GPU1": "NV18"}
    assert gpu1.nvlink_peers == ("GPU0",)
    assert gpu0.cpu_affinity == "0-31"
    assert gpu0.numa is None  # "N/A", not node 0
    assert gpu0.gpu_numa_id is None
    assert topo.nics == []
    assert topo.nic_devices == {}


def test_raw_ansi_one_card() -> None:
    topo = parse_topo(read("nvidia-smi-topo-m_1xH200-VM_raw-ansi.txt"))
    (gpu0,) = topo.cards
    assert gpu0.links == {}
    assert gpu0.nvlink_peers == ()
    assert (gpu0.cpu_affinity, gpu0.numa, gpu0.gpu_numa_id) == ("0-15", 0, None)


def test_gpu_numa_id_read_when_printed() -> None:
    text = (
        "        GPU0    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X      0-71            0               4\n"
    )
    (gpu0,) = parse_topo(text).cards
    assert gpu0.gpu_numa_id == 4


def test_older_driver_without_gpu_numa_id_nor_nic_legend() -> None:
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV4\tPHB\t0-19\tN/A\n"
        "GPU1\tNV4\t X \tPHB\t0-19\tN/A\n"
        "mlx5_0\tPHB\tPHB\t X \t\n"
    )
    topo = parse_topo(text)
    assert topo.nics == ["mlx5_0"]
    assert topo.nic_distance(1, "mlx5_0") == "PHB"
    assert topo.cards[0].gpu_numa_id is None
    assert topo.cards[0].numa is None


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("", "line 1"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "line 1",
        ),
        (
            "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      0-7     0\n",
            "line 2",
        ),
        (
            "        GPU0    GPU1    CPU Affinity\nGPU0     X      NV4     0-7\nGPU9    NV4    X\n",
            "line 3",
        ),
        (
            "        GPU0    CPU Affinity\nGPU0     X      0-7     0     extra\n",
            "line 2",
        ),
        ("        GPU0    GPU1\nGPU0     X      nv4\n", "line 2"),
        ("        GPU0    CPU Affinity\n\nLegend:\n", "line 1"),
    ],
    ids=["empty", "driver-failed", "short-row", "unknown-row", "wide-row", "bad-cell", "no-rows"],
)
def test_unreadable_table_is_refused_naming_the_line(text: str, line: str) -> None:
    with pytest.raises(TopologyFormatError, match=line):
        parse_topo(text)


def test_refusal_is_a_value_error() -> None:
    assert issubclass(TopologyFormatError, ValueError)
