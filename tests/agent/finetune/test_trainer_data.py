"""The trainer refusing what it cannot train on, naming the line or the spec's field:
its reading of the pairs in this process (trainer.py imports only the standard library
until it trains), and the script itself run in the real environment, where a refusal
is one error event on stdout and exit 1, before the model is loaded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from llmgw.agent.finetune import trainenv
from tests.support import tinyhf

SCRIPT = Path(trainenv.__file__).with_name("trainer.py")


def load_trainer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llmgw_trainer_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


trainer = load_trainer()

GOOD = json.dumps({"prompt": "the sky is", "completion": " blue"})
CHAT = json.dumps(
    {
        "messages": [
            {"role": "system", "content": "answer in one word"},
            {"role": "user", "content": "what colour is the sky"},
            {"role": "assistant", "content": "blue"},
        ]
    }
)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "line 3 of the pairs is not JSON"),
        ("[1, 2]", "line 3 of the pairs is not a JSON object"),
        ('{"prompt": "a"}', "line 3 of the pairs needs a string prompt and completion"),
        ('{"prompt": "a", "completion": 5}', "needs a string prompt and completion"),
        ('{"prompt": "a", "completion": ""}', "line 3 of the pairs: the completion is empty"),
        ('{"messages": []}', "line 3 of the pairs: messages must be a list"),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}',
            "line 3 of the pairs: the last message must be the assistant's",
        ),
        (
            '{"messages": [{"role": "robot", "content": "hi"}]}',
            "each message needs a role (system, user, assistant, tool)",
        ),
        ('{"messages": [{"role": "assistant"}]}', "a string content"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str, says: str) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text(f"{GOOD}\n{CHAT}\n{line}\n{GOOD}\n")
    with pytest.raises(trainer.Refusal, match=says.replace("(", r"\(").replace(")", r"\)")):
        trainer.read_pairs(data)


def test_good_lines_are_read_with_their_numbers(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text(f"{GOOD}\n\n{CHAT}\n")  # a blank line is no pair
    pairs = trainer.read_pairs(data)
    assert [(n, prompt, completion) for n, _, prompt, completion in pairs] == [
        (1, "the sky is", " blue"),
        (3, "", "blue"),
    ]
    assert pairs[0][1] is None and [m["role"] for m in pairs[1][1]] == [
        "system",
        "user",
        "assistant",
    ]


def test_an_empty_or_oversized_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n\n")
    with pytest.raises(trainer.Refusal, match="holds no pairs"):
        trainer.read_pairs(data)
    data.write_text("\n" * (trainer.MAX_LINES + 1))
    with pytest.raises(trainer.Refusal, match="100001 lines, past the 100000 allowed"):
        trainer.read_pairs(data)
    data.write_bytes(b"\xff\xfe\n")
    with pytest.raises(trainer.Refusal, match="not UTF-8"):
        trainer.read_pairs(data)


def run_trainer(tmp_path: Path, spec: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [str(tinyhf.trainer_python()), str(SCRIPT), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, [json.loads(x) for x in done.stdout.splitlines()], done.stderr


def a_spec(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # never loaded: the refusals come first
    data = tmp_path / "pairs.jsonl"
    if not data.exists():
        data.write_text(f"{GOOD}\n{CHAT}\n")
    spec = {
        "model_dir": str(model),
        "data": str(data),
        "out": str(tmp_path / "out"),
        "epochs": 1,
        "rank": 4,
        "alpha": None,
        "lr": None,
        "max_len": None,
        "device": "cpu",
        "convert": None,
        "seed": 0,
    }
    return {**spec, **changes}


def test_the_script_refuses_bad_data_naming_the_line(tmp_path: Path) -> None:
    (tmp_path / "pairs.jsonl").write_text(f"{GOOD}\n{GOOD}\n{GOOD}\n" + '{"prompt": 1}\n')
    code, events, stderr = run_trainer(tmp_path, a_spec(tmp_path))
    assert code == 1, stderr
    assert events == [
        {
            "event": "error",
            "reason": "line 4 of the pairs needs a string prompt and completion "
            "(or a messages list)",
        }
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"device": "tpu"}, "the spec's device must be cpu or cuda"),
        ({"epochs": 0}, "the spec's epochs must be an integer of at least 1"),
        ({"rank": "8"}, "the spec's rank must be an integer of at least 1"),
        ({"lr": 5}, "the spec's lr must be a number between 0 and 1, or null"),
        ({"convert": "/no/convert.py"}, "the spec's convert '/no/convert.py' is not a file"),
        ({"model_dir": "/no/model"}, "the base model's directory /no/model holds no config"),
        ({"data": "/no/pairs.jsonl"}, "the pairs file cannot be read"),
    ],
)
def test_the_script_refuses_a_bad_spec_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    code, events, stderr = run_trainer(tmp_path, a_spec(tmp_path, **changes))
    assert code == 1, stderr
    assert len(events) == 1 and events[0]["event"] == "error", events
    assert says in events[0]["reason"]
