"""`ctl model serve --env NAME=VALUE` (repeated) sends the variables in the body's
``env``; one not NAME=VALUE is refused by the parser; the model's text shows them."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from llmgw.cli import build_parser
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_models import commands, model_text
from tests.client.test_ctl_models import model_json


class FakeAdmin(AdminClient):
    def __init__(self) -> None:
        super().__init__("http://cp", "t")
        self.bodies: list[Any] = []

    def serve(self, body: Any) -> Any:
        self.bodies.append(body)
        return {"name": "m"}


def run(argv: list[str]) -> FakeAdmin:
    admin = FakeAdmin()
    args: argparse.Namespace = build_parser().parse_args(["ctl", "model", "serve", *argv])
    args.json = True
    assert commands(lambda _: admin)["serve"](args) == 0
    return admin


def test_env_is_sent_as_a_map() -> None:
    admin = run(["hf:o/r", "--env", "NCCL_DEBUG=INFO", "--env", "A=b=c"])
    assert admin.bodies[0]["env"] == {"NCCL_DEBUG": "INFO", "A": "b=c"}
    assert "env" not in run(["hf:o/r"]).bodies[0]


def test_env_without_a_value_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ctl", "model", "serve", "hf:o/r", "--env", "NCCL_DEBUG"])
    assert "'NCCL_DEBUG' is not KEY=VALUE" in capsys.readouterr().err


def test_model_text_shows_a_profiles_env() -> None:
    shown = model_json()
    shown["profiles"][0]["env"] = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0"}
    text = model_text(shown)  # type: ignore[arg-type]
    assert "env: NCCL_DEBUG=INFO NCCL_IB_HCA=mlx5_0" in text
    assert "env:" not in model_text(model_json())  # type: ignore[arg-type]
