"""Recording a machine: NVML's answers through our interface, and the packaging script
that records every nvidia-smi form beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmgw.agent.discovery import FakeCard, FakeNvml
from llmgw.agent.discovery.nvml import FIGURES
from llmgw.agent.discovery.nvmlrecord import record

REPO = Path(__file__).parent.parent.parent
SMI = Path(__file__).parent / "fixtures" / "smi" / "h100-hgx_2cards_580.105.08.xml"


def test_record_writes_each_answer_or_its_error() -> None:
    card = FakeCard("GPU-a", "NVIDIA H200", 141 << 30, 1 << 30, 3, (9, 0), figures={"power": 88.5})
    nvml = FakeNvml([card])
    nvml.init()
    nvml.xid(0, 79)
    got = record(nvml)
    assert got["driver_version"] == {"value": "550.54.15"}
    (one,) = got["cards"]
    assert one["memory"] == {"value": [141 << 30, 1 << 30]}
    assert one["figures"]["power"] == {"value": 88.5}
    assert one["figures"]["fan"] == {"error": "Not Supported"}
    assert set(one["figures"]) == set(FIGURES)
    assert json.loads(json.dumps(got["xid_events"])) == {"value": [[0, 79]]}
    json.dumps(got)  # plain JSON, as the script writes it


def test_the_script_records_every_form(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  "-q -x") cat "{SMI}" ;;\n'
        '  "--query-gpu=driver_version --format=csv,noheader") echo 580.105.08 ;;\n'
        '  "--query-gpu=pci.bus_id --format=csv,noheader") echo 00000000:19:00.0 ;;\n'
        '  "--help-query-gpu") printf \'"index"\\n"uuid"\\n\' ;;\n'
        '  "-L") echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)" ;;\n'
        '  *) echo "nvidia-smi: $* not supported here" >&2; exit 3 ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "rec"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", str(REPO / "packaging" / "record-gpu.sh"), str(out), sys.executable],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "nvidia-smi-q-x_580.105.08.xml").read_text() == SMI.read_text()
    assert "GPU-a" in (out / "nvidia-smi-L_580.105.08.txt").read_text()
    # A form this nvidia-smi refuses leaves its error beside an empty capture.
    assert "not supported here" in (out / "nvidia-smi-topo-m_580.105.08.txt.err").read_text()
    # No driver here: NVML's record says it did not start, and the script goes on.
    assert "NVML did not start" in (out / "nvml_580.105.08.json").read_text()
