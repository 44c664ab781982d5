"""The runner's ``Toolkit`` over ``trainenv``: the trainer's environment, llama.cpp's
conversion script, and ``trainer.py``, each kept under one directory of the agent's.

``trainenv`` is looked up by name, so an llmgw built without the trainer still runs its
agent, whose runner then refuses a fine-tune with that said (``trainer_kit`` None)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from llmgw.agent.finetune.runner import Toolkit


class TrainEnvKit:
    def __init__(self, trainenv: ModuleType, root: Path) -> None:
        self.trainenv = trainenv
        self.root = root

    async def python(self, progress: Callable[[str], None]) -> Path:
        return Path(await self.trainenv.ensure_env(self.root, progress=progress))

    async def converter(self, progress: Callable[[str], None]) -> Path:
        return Path(await self.trainenv.ensure_converter(self.root, progress=progress))

    def script(self) -> bytes:
        return bytes(self.trainenv.trainer_script())


def trainer_kit(root: Path) -> Toolkit | None:
    try:
        trainenv = importlib.import_module("llmgw.agent.finetune.trainenv")
    except ImportError:
        return None
    return TrainEnvKit(trainenv, root)
