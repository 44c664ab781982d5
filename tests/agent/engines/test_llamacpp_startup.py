"""llama.cpp's start-up output read into Compute, from lines in its real formats."""

# The lines are kept whole, as llama.cpp prints them.
# ruff: noqa: E501

from __future__ import annotations

from llmgw.agent.engines import adapter
from llmgw.wire.messages import Compute

CPU_RUN = """\
build: 0 (unknown) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu
system info: n_threads = 2, n_threads_batch = 2, total_threads = 2

system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |

main: binding port with default address family
main: HTTP server is listening, hostname: 127.0.0.1, port: 8123, http threads: 1
main: loading model
srv    load_model: loading model '/w/tiny.gguf'
llama_model_loader: loaded meta data with 24 key-value pairs and 39 tensors from /w/tiny.gguf (version GGUF V3 (latest))
print_info: n_layer          = 4
load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors:   CPU_Mapped model buffer size =     0.61 MiB
main: model loaded
main: server is listening on http://127.0.0.1:8123 - starting the main loop
""".splitlines()

CUDA_RUN = """\
ggml_cuda_init: GGML_CUDA_FORCE_MMQ:    no
ggml_cuda_init: GGML_CUDA_FORCE_CUBLAS: no
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0, VMM: yes
load_backend: loaded CUDA backend from /opt/llama/b6123-cuda/build/bin/libggml-cuda.so
load_backend: loaded CPU backend from /opt/llama/b6123-cuda/build/bin/libggml-cpu-sapphirerapids.so
build: 6123 (79c1160b) with cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0 for x86_64-linux-gnu
system_info: n_threads = 8 (n_threads_batch = 8) / 32 | CUDA : ARCHS = 500,610,700,750,800,860,890,900 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 |
main: loading model
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100 80GB HBM3) (0000:19:00.0) - 80520 MiB free
load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors: offloading 32 repeating layers to GPU
load_tensors: offloading output layer to GPU
load_tensors: offloaded 33/33 layers to GPU
load_tensors:        CUDA0 model buffer size =  4403.49 MiB
load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
main: model loaded
""".splitlines()

CUDA_NONE_OFFLOADED = [
    line.replace("offloaded 33/33", "offloaded 0/33")
    for line in CUDA_RUN
    if "offloading" not in line and "CUDA0 model buffer" not in line
]

parse = adapter("llama.cpp").parse_startup


def test_cpu_run_has_no_offload_figure() -> None:
    c = parse(CPU_RUN)
    assert c == Compute(backend="CPU", devices=[], offloaded_layers=None, total_layers=None)


# A CPU build with the RPC backend (llama-cpp-python 0.3.36, GGML_RPC=ON) at its
# default -ngl: it says it offloaded every layer "to GPU" while naming no device.
CPU_RPC_BUILD_RUN = """\
0.00.007.312 I cmn  common_param: common_params_print_info: build 1 (0c1e570) with GNU 12.2.0 for Linux x86_64
0.00.007.313 I cmn  common_param: device_info:
0.00.007.323 I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)
0.00.007.380 I cmn  common_param: system_info: n_threads = 1 (n_threads_batch = 1) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |
0.00.012.784 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.013.104 I load_tensors: offloading output layer to GPU
0.00.013.120 I load_tensors: offloading 1 repeating layers to GPU
0.00.013.121 I load_tensors: offloaded 3/3 layers to GPU
0.00.013.123 I load_tensors:   CPU_Mapped model buffer size =     0.48 MiB
""".splitlines()


def test_layers_offloaded_to_no_device_are_not_counted() -> None:
    c = parse(CPU_RPC_BUILD_RUN)
    assert c == Compute(backend="CPU", devices=[], offloaded_layers=None, total_layers=None)


def test_one_card_fully_offloaded() -> None:
    c = parse(CUDA_RUN)
    assert c.backend == "CUDA"
    assert c.devices == ["CUDA0 (NVIDIA H100 80GB HBM3)"]
    assert (c.offloaded_layers, c.total_layers) == (33, 33)


def test_cuda_with_nothing_offloaded_says_zero() -> None:
    c = parse(CUDA_NONE_OFFLOADED)
    assert c.backend == "CUDA"
    assert c.offloaded_layers == 0 and c.total_layers == 33


def test_cuda_build_that_found_no_card_runs_on_cpu() -> None:
    lines = [
        "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected",
        "load_backend: loaded CPU backend from /opt/llama/libggml-cpu-haswell.so",
        "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 |",
        "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB",
    ]
    assert parse(lines) == Compute(backend="CPU", devices=[])


def test_older_format_without_pci_address_or_using_device() -> None:
    lines = [
        "ggml_cuda_init: found 2 CUDA devices:",
        "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes",
        "  Device 1: NVIDIA H200, compute capability 9.0, VMM: yes",
        "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 |",
        "llm_load_tensors: offloaded 33/33 layers to GPU",
    ]
    c = parse(lines)
    assert c.devices == ["CUDA0 (NVIDIA H200)", "CUDA1 (NVIDIA H200)"]
    assert c.backend == "CUDA" and c.offloaded_layers == 33
    old_using = (
        "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) - 140000 MiB free"
    )
    assert parse([old_using]).devices == ["CUDA0 (NVIDIA H200)"]


def test_last_run_in_a_log_wins() -> None:
    # An engine log kept across restarts: a CUDA run, then a run on the CPU.
    c = parse(["--- llmgw: starting", *CUDA_RUN, "--- llmgw: starting", *CPU_RUN])
    assert c.backend == "CPU" and c.devices == [] and c.offloaded_layers is None
    c = parse([*CPU_RUN, *CUDA_RUN])
    assert c.backend == "CUDA" and c.offloaded_layers == 33


def test_nothing_read_means_nothing_reported() -> None:
    assert parse([]) == Compute()
    assert parse(["main: loading model", "srv  update_slots: all slots are idle"]) == Compute()
    assert adapter("vllm").parse_startup(CUDA_RUN) == Compute()
