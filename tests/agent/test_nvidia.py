"""NVIDIA cards: the nvidia-smi CSV parser, the nvidia-smi run, NVML and the choice."""

from __future__ import annotations

import stat
from pathlib import Path

import pynvml
import pytest

from llmgw.agent.discovery import (
    QUERY_FIELDS,
    FakeCard,
    FakeNvml,
    NvidiaCards,
    NvidiaSmiFormatError,
    NvmlError,
    NvmlUnavailable,
    PynvmlSource,
    is_gpu_warning,
    parse_query_gpu_csv,
    read_nvml,
    run_nvidia_smi,
)
from llmgw.agent.discovery.nvidia_smi import OLD_DRIVER_FIELDS

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1 << 20
GiB = 1 << 30
H100_CSV = FIXTURES / "nvidia-smi_8xH100_noheader-nounits.csv"


def fake_smi(tmp_path: Path, body: str, name: str = "nvidia-smi") -> Path:
    """An executable standing in for nvidia-smi; it logs its arguments to args.log."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{tmp_path}/args.log"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- the parser ----------------------------------------------------------------------


def test_parses_eight_h100s_without_header_or_units() -> None:
    gpus = parse_query_gpu_csv(H100_CSV.read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert len({g.uuid for g in gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in gpus)
    first, busy = gpus[0], gpus[4]
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.memory_total == 81559 * MiB
    assert first.memory_used == 0  # read as 0 MiB: a real zero, not an absent one
    assert first.compute_capability == "9.0"
    assert first.driver == "550.54.15"
    assert (busy.memory_used, busy.utilization) == (71234 * MiB, 97)


def test_absent_markers_read_as_none() -> None:
    a, b = parse_query_gpu_csv(
        (FIXTURES / "nvidia-smi_2x_na-fields_noheader-nounits.csv").read_text()
    )
    assert a.utilization is None  # [N/A], as under MIG
    assert (a.memory_total, a.memory_used, a.compute_capability) == (81920 * MiB, 1093 * MiB, "8.0")
    assert b.memory_total is None  # [Not Supported]
    assert b.memory_used is None  # [Unknown Error]
    assert b.utilization is None  # [Requested functionality has been deprecated]
    assert b.compute_capability is None  # N/A
    assert b.driver == "535.161.08"


def test_header_with_units_matches_columns_by_name() -> None:
    (gpu,) = parse_query_gpu_csv((FIXTURES / "nvidia-smi_1xH200_header-units.csv").read_text())
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-8e81973e-0bec-47b0-b898-d190f9ebdacc"
    assert gpu.memory_total == 143771 * MiB
    assert gpu.memory_used == 612 * MiB
    assert gpu.utilization == 3
    assert gpu.compute_capability == "9.0"
    assert gpu.driver == "570.124.06"


def test_header_without_units_takes_the_unit_from_the_header() -> None:
    text = "index, uuid, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%]\n"
    text += "0, GPU-1, NVIDIA L4, 23034, 0, 0\n"
    (gpu,) = parse_query_gpu_csv(text)
    assert gpu.memory_total == 23034 * MiB
    assert gpu.compute_capability is None and gpu.driver is None  # columns not asked for


def test_old_driver_fields_have_no_compute_capability() -> None:
    (gpu,) = parse_query_gpu_csv(
        "0, GPU-9, Tesla V100-SXM2-16GB, 16160, 0, 0, 470.82.01\n", OLD_DRIVER_FIELDS
    )
    assert gpu.driver == "470.82.01" and gpu.compute_capability is None


@pytest.mark.parametrize(
    "text",
    [
        "0, GPU-1, NVIDIA L4, 23034\n",  # too few fields
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "[N/A], GPU-1, NVIDIA L4, 1, 1, 1, 8.9, 550.54.15\n",  # no index
        "0, [N/A], NVIDIA L4, 1, 1, 1, 8.9, 550.54.15\n",  # no uuid
    ],
)
def test_malformed_output_is_a_format_error(text: str) -> None:
    with pytest.raises(NvidiaSmiFormatError):
        parse_query_gpu_csv(text)


def test_empty_output_is_no_cards() -> None:
    assert parse_query_gpu_csv("\n") == []


# -- running nvidia-smi ----------------------------------------------------------------


async def test_runs_the_query_and_parses_it(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, f'cat "{H100_CSV}"')
    reading = await run_nvidia_smi([str(smi)])
    assert reading.installed and reading.warnings == []
    assert reading.gpus is not None and len(reading.gpus) == 8
    args = (tmp_path / "args.log").read_text().split()
    assert args == [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


async def test_missing_nvidia_smi_is_no_cards_and_no_warning(tmp_path: Path) -> None:
    reading = await run_nvidia_smi([str(tmp_path / "nvidia-smi")])
    assert (reading.gpus, reading.installed, reading.warnings) == ([], False, [])


async def test_failing_nvidia_smi_is_a_warning(tmp_path: Path) -> None:
    smi = fake_smi(
        tmp_path,
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        'driver. Make sure that the latest NVIDIA driver is installed and running."\nexit 9',
    )
    reading = await run_nvidia_smi([str(smi)])
    assert reading.gpus is None and reading.installed
    (warning,) = reading.warnings
    assert warning.startswith("nvidia-smi: failed (exit 9): NVIDIA-SMI has failed")
    assert "Fix:" in warning and is_gpu_warning(warning)


async def test_old_driver_query_is_retried_without_compute_cap(tmp_path: Path) -> None:
    smi = fake_smi(
        tmp_path,
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to '
        "query.'; exit 2;; esac\necho '0, GPU-7, Tesla V100-SXM2-16GB, 16160, 3, 0, 470.82.01'",
    )
    reading = await run_nvidia_smi([str(smi)])
    assert reading.warnings == []
    assert reading.gpus is not None
    assert [(g.name, g.driver, g.compute_capability) for g in reading.gpus] == [
        ("Tesla V100-SXM2-16GB", "470.82.01", None)
    ]


async def test_no_devices_is_an_empty_list_with_a_warning(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, "echo 'No devices were found'\nexit 6")
    reading = await run_nvidia_smi([str(smi)])
    assert reading.gpus == []
    assert reading.warnings and "NVIDIA_VISIBLE_DEVICES" in reading.warnings[0]


async def test_hung_nvidia_smi_times_out_with_a_warning(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, "exec sleep 30")
    reading = await run_nvidia_smi([str(smi)], timeout=0.3)
    assert reading.gpus is None
    assert reading.warnings[0].startswith("nvidia-smi: no answer in 0.3 s")


# -- NVML ------------------------------------------------------------------------------

H100 = FakeCard("GPU-a", "NVIDIA H100 80GB HBM3", 80 * GiB, 2 * GiB, 35, (9, 0))
MIG_A100 = FakeCard("GPU-b", "NVIDIA A100-SXM4-80GB", 80 * GiB, 1 * GiB, None, (8, 0))


def test_read_nvml_from_the_fake() -> None:
    nvml = FakeNvml([H100, MIG_A100], driver="550.54.15")
    nvml.init()
    gpus, warnings = read_nvml(nvml)
    assert warnings == []
    assert [(g.index, g.uuid, g.compute_capability, g.driver) for g in gpus] == [
        (0, "GPU-a", "9.0", "550.54.15"),
        (1, "GPU-b", "8.0", "550.54.15"),
    ]
    assert (gpus[0].memory_total, gpus[0].memory_used, gpus[0].utilization) == (
        80 * GiB,
        2 * GiB,
        35,
    )
    assert gpus[1].utilization is None  # NVML: Not Supported under MIG


def test_read_nvml_skips_a_lost_card_with_a_warning() -> None:
    nvml = FakeNvml([H100, FakeCard("GPU-x", "lost", lost=True)], driver=None)
    nvml.init()
    gpus, warnings = read_nvml(nvml)
    assert [g.uuid for g in gpus] == ["GPU-a"]
    assert gpus[0].driver is None
    (warning,) = warnings
    assert warning.startswith("NVML: card 1 could not be read (GPU is lost)")


class _Memory:
    total, used = 80 * GiB, 3 * GiB


def test_pynvml_source_translates_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real adapter, over pynvml functions replaced as a driver would answer."""

    def not_supported(handle: object) -> object:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    answers = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "590.48.01",
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
        "nvmlDeviceGetUUID": lambda h: b"GPU-bytes",  # old nvidia-ml-py answered bytes
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetMemoryInfo": lambda h: _Memory(),
        "nvmlDeviceGetUtilizationRates": not_supported,
        "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
    }
    for name, fn in answers.items():
        monkeypatch.setattr(pynvml, name, fn)
    source = PynvmlSource()
    source.init()
    (gpu,), warnings = read_nvml(source)
    source.shutdown()
    assert warnings == []
    assert gpu.uuid == "GPU-bytes" and gpu.name == "NVIDIA H200"
    assert (gpu.memory_total, gpu.memory_used) == (80 * GiB, 3 * GiB)
    assert gpu.utilization is None
    assert (gpu.compute_capability, gpu.driver) == ("9.0", "590.48.01")
    with pytest.raises(NvmlError):
        source.device_count()  # shut down


@pytest.mark.parametrize(
    ("code", "unavailable"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, True),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, True),
        (pynvml.NVML_ERROR_NO_PERMISSION, False),
    ],
)
def test_pynvml_start_errors(monkeypatch: pytest.MonkeyPatch, code: int, unavailable: bool) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    with pytest.raises(NvmlError) as caught:
        PynvmlSource().init()
    assert isinstance(caught.value, NvmlUnavailable) is unavailable


# -- which source answers ----------------------------------------------------------------


async def test_nvml_answers_and_nvidia_smi_is_not_run(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, "exit 0")
    nvml = FakeNvml([H100])
    cards = NvidiaCards(nvml, str(smi))
    first = await cards.read(retry_nvml=True)
    await cards.read(retry_nvml=True)
    assert first.source == "nvml"
    assert first.gpus is not None and [g.uuid for g in first.gpus] == ["GPU-a"]
    assert nvml.init_calls == 1  # started once, kept open
    assert not (tmp_path / "args.log").exists()
    await cards.close()
    assert not nvml.started


async def test_no_nvml_and_no_nvidia_smi_is_no_cards(tmp_path: Path) -> None:
    cards = NvidiaCards(FakeNvml(unavailable=True), str(tmp_path / "nvidia-smi"))
    reading = await cards.read()
    assert (reading.gpus, reading.source, reading.warnings) == ([], None, [])


async def test_no_nvml_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, f'cat "{H100_CSV}"')
    reading = await NvidiaCards(FakeNvml(unavailable=True), str(smi)).read()
    assert reading.source == "nvidia-smi"
    assert reading.gpus is not None and len(reading.gpus) == 8
    assert reading.warnings == []


async def test_nvml_failing_to_start_warns_and_falls_back(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, f'cat "{H100_CSV}"')
    nvml = FakeNvml([H100], init_error="Driver/library version mismatch")
    cards = NvidiaCards(nvml, str(smi))
    reading = await cards.read()
    assert reading.source == "nvidia-smi"
    (warning,) = reading.warnings
    assert warning.startswith("NVML: could not start (Driver/library version mismatch)")
    # A heartbeat does not retry NVML's start; a full scan does.
    await cards.read()
    assert nvml.init_calls == 1
    nvml.init_error = None
    healed = await cards.read(retry_nvml=True)
    assert (healed.source, nvml.init_calls, healed.warnings) == ("nvml", 2, [])


async def test_nvml_failing_without_nvidia_smi_is_not_read_rather_than_none(tmp_path: Path) -> None:
    nvml = FakeNvml([H100], init_error="Unknown Error")
    reading = await NvidiaCards(nvml, str(tmp_path / "absent")).read()
    assert reading.gpus is None and reading.source is None
    assert reading.warnings and all(is_gpu_warning(w) for w in reading.warnings)


async def test_nvidia_smi_failing_after_no_nvml_is_a_warning(tmp_path: Path) -> None:
    smi = fake_smi(
        tmp_path, "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18"
    )
    reading = await NvidiaCards(FakeNvml(unavailable=True), str(smi)).read()
    assert reading.gpus is None and reading.source is None
    (warning,) = reading.warnings
    assert "exit 18" in warning and "version mismatch" in warning
