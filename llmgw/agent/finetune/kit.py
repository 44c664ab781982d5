"""The runner's ``Toolkit`` over ``trainenv``: the trainer's environment, llama.cpp's
conversion script, and ``trainer.py``, each kept under one directory of the agent's
(``STATE_DIR/trainer``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmgw.agent.finetune import trainenv


class TrainEnvKit:
    def __init__(self, root: Path, converter_source: str | None = None) -> None:
        """``converter_source``: llama.cpp's source archive or tree (a URL or a path on
        this node) for an offline node; None: the tag's archive on GitHub."""
        self.root = root
        self.converter_source = converter_source

    async def python(self, progress: Callable[[str], None]) -> Path:
        return await trainenv.ensure_env(self.root, progress=progress)

    async def converter(self, progress: Callable[[str], None]) -> Path:
        return await trainenv.ensure_converter(
            self.root, source=self.converter_source, progress=progress
        )

    def script(self) -> bytes:
        return trainenv.trainer_script()
