"""The trainer run for real on the CPU, in the environment a node makes: a tiny
Llama-shaped checkpoint fine-tuned on 20 pairs (prompt/completion and chat), its
events as the runner reads them, the loss falling, the same seed giving the same
losses, the adapter converted to GGUF by llama.cpp's script, and llama-server loading
that GGUF beside the base model and answering with what was trained.

One run of the trainer serves every test here (the module's fixture; the module is one
xdist group, tests/conftest.py GROUPS): importing PyTorch and transformers is most of
its time."""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.finetune import trainenv
from tests.support import tinyhf
from tests.support.ports import free_port

SUBJECTS = {"sky": "blue", "grass": "green", "sun": "red", "sea": "blue", "moon": "red"}
EPOCHS = 10
SEED = 3


def write_pairs(path: Path) -> Path:
    lines = []
    for i in range(10):
        subject, colour = list(SUBJECTS.items())[i % 5]
        lines.append({"prompt": f"the colour of the {subject} is", "completion": f" {colour}"})
    for i in range(10):
        subject, colour = list(SUBJECTS.items())[i % 5]
        said = f"the {subject} is {colour}"
        user = {"role": "user", "content": f"what colour is the {subject}"}
        lines.append({"messages": [user, {"role": "assistant", "content": said}]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    stderr: str


def start(script: Path, spec: dict[str, Any], where: Path) -> subprocess.Popen[str]:
    where.mkdir(parents=True)
    (where / "spec.json").write_text(json.dumps(spec))
    argv = [str(tinyhf.trainer_python()), str(script), str(where / "spec.json")]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> Run:
    out, err = proc.communicate(timeout=600)
    # Every stdout line is one event: a line that is not JSON fails here.
    return Run(proc.returncode, [json.loads(line) for line in out.splitlines()], err)


@dataclass
class Trained:
    hf: Path
    base_gguf: Path
    out: Path
    run: Run
    again: Run  # one epoch, the same seed


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("trainer")
    script = root / "trainer.py"
    script.write_bytes(trainenv.trainer_script())  # as the runner writes it
    hf = tinyhf.write_tiny_hf(root / "hf")
    data = write_pairs(root / "pairs.jsonl")
    spec = {
        "model_dir": str(hf),
        "data": str(data),
        "out": str(root / "a" / "out"),
        "epochs": EPOCHS,
        "rank": 8,
        "alpha": None,
        "lr": 0.02,
        "max_len": None,
        "device": "cpu",
        "convert": str(tinyhf.converter()),
        "seed": SEED,
    }
    first = start(script, spec, root / "a")
    once = {**spec, "out": str(root / "b" / "out"), "epochs": 1, "convert": None}
    again = start(script, once, root / "b")
    # The base model's GGUF meanwhile: llama-server needs it beside the adapter.
    base: list[Path] = []
    converting = threading.Thread(
        target=lambda: base.append(tinyhf.to_gguf(hf, root / "base.gguf"))
    )
    converting.start()
    run, rerun = finish(first), finish(again)
    converting.join()
    assert base, "the base model's conversion failed (its error is above)"
    return Trained(hf, base[0], root / "a" / "out", run, rerun)


def test_the_events_follow_the_contract(trained: Trained) -> None:
    run = trained.run
    assert run.code == 0, run.stderr[-3000:]
    kinds = [e["event"] for e in run.events]
    steps = math.ceil(20 / 4) * EPOCHS  # four pairs a step
    assert kinds == ["start"] + ["step"] * steps + ["saved", "converted"]
    assert run.events[0] == {"event": "start", "steps": steps, "pairs": 20}
    logged = run.events[1:-2]
    assert [e["step"] for e in logged] == list(range(1, steps + 1))
    for e in logged:
        assert math.isfinite(e["loss"]) and e["loss"] > 0
        assert 100 < e["peak_mib"] < 16_000  # this process's peak RSS, in MiB
    adapter = trained.out / "adapter"
    assert run.events[-2] == {"event": "saved", "dir": str(adapter)}
    assert run.events[-1] == {"event": "converted", "gguf": str(trained.out / "adapter.gguf")}
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16  # alpha null: twice the rank
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0


def test_the_loss_falls(trained: Trained) -> None:
    losses = [e["loss"] for e in trained.run.events if e["event"] == "step"]
    assert losses, trained.run.stderr[-3000:]
    last_epoch = losses[-5:]
    assert max(last_epoch) < losses[0] / 2, losses


def test_the_same_seed_gives_the_same_steps(trained: Trained) -> None:
    """A run of one epoch with the same seed takes the first epoch's steps: the same
    pairs in the same order from the same adapter start, so the same losses."""
    assert trained.again.code == 0, trained.again.stderr[-3000:]
    once = [e["loss"] for e in trained.again.events if e["event"] == "step"]
    first_epoch = [e["loss"] for e in trained.run.events if e["event"] == "step"][:5]
    assert len(once) == 5
    assert once == pytest.approx(first_epoch, rel=1e-5)
    assert [e["event"] for e in trained.again.events][-1] == "saved"  # no convert asked


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def _first_tokens(port: int, prompt: str, scale: float) -> set[str]:
    """The five likeliest first tokens after ``prompt`` with the adapter at ``scale``."""
    body = {
        "prompt": prompt,
        "n_predict": 1,
        "temperature": 0,
        "n_probs": 5,
        "lora": [{"id": 0, "scale": scale}],
    }
    answer = _post(f"http://127.0.0.1:{port}/completion", body)
    return {t["token"].strip() for t in answer["completion_probabilities"][0]["top_logprobs"]}


def test_llama_server_serves_the_converted_adapter(
    trained: Trained, binary: Path, tmp_path: Path
) -> None:
    gguf = trained.out / "adapter.gguf"
    assert gguf.is_file(), trained.run.stderr[-3000:]
    port = free_port()
    argv = [str(binary), "-m", str(trained.base_gguf), "--lora", str(gguf)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "-c", "256", "-t", "1"]
    with (tmp_path / "server.log").open("w") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not come up in 60s"
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lora-adapters") as answer:
            loaded = json.load(answer)
        assert [Path(a["path"]).name for a in loaded] == ["adapter.gguf"]
        colours = set(SUBJECTS.values())
        for subject in SUBJECTS:
            prompt = f"the colour of the {subject} is"
            # With the adapter the colours the pairs taught come first; without it the
            # random base model has never heard of them.
            assert colours <= _first_tokens(port, prompt, 1.0), subject
            assert not colours & _first_tokens(port, prompt, 0.0), subject
    finally:
        server.terminate()
        server.wait(timeout=30)
