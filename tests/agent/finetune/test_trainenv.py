"""The trainer's environment and llama.cpp's conversion scripts, as a node makes them:
uv run with the pins (a stand-in uv that records what it was asked and makes a
stand-in environment), made once and found after, made again when the pins differ;
the conversion scripts taken from a tree, an archive or a URL, refused when they are
not llama.cpp's. The real environment is made and used by test_trainer_run.py."""

from __future__ import annotations

import ast
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from llmgw.agent.finetune import trainenv
from llmgw.agent.finetune.kit import TrainEnvKit
from llmgw.agent.finetune.trainenv import TrainEnvError
from tests.support.engines import Mirror

FAKE_UV = """#!{python}
import pathlib, sys
pathlib.Path({log!r}).open("a").write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "venv":
    bin = pathlib.Path(sys.argv[-1]) / "bin"
    bin.mkdir(parents=True)
    (bin / "python").write_text("#!/bin/sh\\nexit {python_exit}\\n")
    (bin / "python").chmod(0o755)
elif {fail_install}:
    print("Because torch==0 was not found in the package registry, the install failed.")
    sys.exit(1)
"""


def fake_uv(tmp_path: Path, *, fail_install: bool = False, python_exit: int = 0) -> Path:
    uv = tmp_path / "uv"
    log = tmp_path / "uv.log"
    uv.write_text(
        FAKE_UV.format(
            python=sys.executable, log=str(log), fail_install=fail_install, python_exit=python_exit
        )
    )
    uv.chmod(0o755)
    return uv


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "uv.log"
    return log.read_text().splitlines() if log.is_file() else []


async def test_the_environment_is_made_with_the_pins(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    said: list[str] = []
    python = await trainenv.ensure_env(tmp_path / "ft", uv=str(uv), progress=said.append)
    directory = tmp_path / "ft" / f"env-{trainenv.pin_hash()}"
    assert python == directory / "venv" / "bin" / "python"
    venv, install = calls(tmp_path)
    assert venv.startswith("venv --relocatable --python ")
    staging = f"{tmp_path}/ft/.env-{trainenv.pin_hash()}.making/venv"
    assert install == f"pip install --python {staging}/bin/python " + " ".join(trainenv.PINS)
    marker = json.loads((directory / trainenv.ENV_MARKER).read_text())
    assert marker["pins"] == list(trainenv.PINS)
    assert [p.name for p in (tmp_path / "ft").iterdir() if p.name.startswith(".env")] == []
    assert said[-1] == "trainer environment ready"
    assert "torch==2.11.0" in trainenv.PINS and "peft==0.18.1" in trainenv.PINS


async def test_an_environment_already_made_is_found_not_made_again(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    first = await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    made = len(calls(tmp_path))
    assert await trainenv.ensure_env(tmp_path / "ft", uv=str(uv)) == first
    assert len(calls(tmp_path)) == made


async def test_other_pins_make_another_environment(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    first = await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    pins = (*trainenv.PINS[:-1], "numpy==2.2.5")
    other = await trainenv.ensure_env(tmp_path / "ft", uv=str(uv), pins=pins)
    assert other != first and first.exists()
    assert calls(tmp_path)[-1].endswith("numpy==2.2.5")


async def test_a_marker_naming_other_pins_is_not_the_environment(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    python = await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    marker = python.parents[2] / trainenv.ENV_MARKER
    marker.write_text(json.dumps({"pins": ["torch==1.0"]}))
    made = len(calls(tmp_path))
    await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    assert len(calls(tmp_path)) == made + 2  # venv and pip install again
    assert json.loads(marker.read_text())["pins"] == list(trainenv.PINS)


async def test_the_torch_build_and_index_go_to_uv(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path)
    index = "https://pypi.example/simple"
    await trainenv.ensure_env(tmp_path / "ft", uv=str(uv), torch_backend="cu129", index_url=index)
    assert calls(tmp_path)[-1].endswith(f"--torch-backend cu129 --index-url {index}")


async def test_a_failed_install_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, fail_install=True)
    with pytest.raises(TrainEnvError, match="torch==0 was not found") as caught:
        await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    assert "could not install the trainer's packages (exit 1)" in str(caught.value)
    assert list((tmp_path / "ft").iterdir()) == []


async def test_an_environment_that_cannot_import_is_not_made(tmp_path: Path) -> None:
    uv = fake_uv(tmp_path, python_exit=1)
    with pytest.raises(TrainEnvError, match="could not import them"):
        await trainenv.ensure_env(tmp_path / "ft", uv=str(uv))
    assert list((tmp_path / "ft").iterdir()) == []


async def test_no_uv_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrainEnvError, match="needs uv; install it on this node"):
        await trainenv.ensure_env(tmp_path / "ft", uv=str(tmp_path / "no-uv"))


# --- the conversion scripts ----------------------------------------------------------


def llama_tree(top: Path, *, without: str | None = None) -> Path:
    """A stand-in llama.cpp tree: its conversion parts, and a file nothing takes."""
    top.mkdir(parents=True)
    files = {
        "convert_lora_to_gguf.py": "# lora\n",
        "convert_hf_to_gguf.py": "# hf\n",
        "conversion/__init__.py": "# models\n",
        "gguf-py/gguf/__init__.py": "# gguf\n",
        "src/llama.cpp": "// not taken\n",
    }
    for name, text in files.items():
        if without and name.startswith(without):
            continue
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    return top


def tar_of(tree: Path, archive: Path, prefix: str) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=prefix)
    return archive


def assert_taken(script: Path, directory: Path) -> None:
    assert script == directory / "convert_lora_to_gguf.py"
    assert script.read_text() == "# lora\n"
    assert (directory / "conversion" / "__init__.py").is_file()
    assert (directory / "gguf-py" / "gguf" / "__init__.py").is_file()
    assert (directory / "convert_hf_to_gguf.py").is_file()
    assert not (directory / "src").exists()
    marker = json.loads((directory / trainenv.CONVERTER_MARKER).read_text())
    assert marker["version"] == directory.name.removeprefix("llama.cpp-")


async def test_the_scripts_come_from_a_tree_that_vendors_llama_cpp(tmp_path: Path) -> None:
    vendor = llama_tree(tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp")
    source = str(tmp_path / "llama_cpp_python-0.3.36")
    script = await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=source)
    assert_taken(script, tmp_path / "ft" / "llama.cpp-b6000")
    assert vendor.is_dir()  # the source is read, never moved
    # Found after: another source is not read.
    again = await trainenv.ensure_converter(tmp_path / "ft", "b6000", source="/nowhere")
    assert again == script


async def test_the_scripts_come_from_a_source_archive(tmp_path: Path) -> None:
    tree = llama_tree(tmp_path / "tree")
    archive = tar_of(tree, tmp_path / "b6000.tar.gz", "llama.cpp-b6000")
    script = await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=str(archive))
    assert_taken(script, tmp_path / "ft" / "llama.cpp-b6000")
    assert [p.name for p in (tmp_path / "ft").iterdir()] == ["llama.cpp-b6000"]


async def test_the_scripts_come_from_a_url(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    tar_of(llama_tree(tmp_path / "tree"), served / "b6000.tar.gz", "llama.cpp-b6000")
    mirror = Mirror(served)
    try:
        url = f"{mirror.url}/b6000.tar.gz"
        script = await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=url)
        assert_taken(script, tmp_path / "ft" / "llama.cpp-b6000")
        with pytest.raises(TrainEnvError, match="answered HTTP 404; check the llama.cpp"):
            await trainenv.ensure_converter(tmp_path / "ft", "b7", source=f"{mirror.url}/b7.tgz")
    finally:
        mirror.close()
    assert trainenv.SOURCE_URL.format(version="b6000") == (
        "https://github.com/ggml-org/llama.cpp/archive/refs/tags/b6000.tar.gz"
    )


async def test_a_tree_without_a_part_is_refused_naming_it(tmp_path: Path) -> None:
    tree = llama_tree(tmp_path / "tree", without="gguf-py")
    with pytest.raises(TrainEnvError, match="has no gguf-py"):
        await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=str(tree))
    assert list((tmp_path / "ft").iterdir()) == []


async def test_what_is_not_llama_cpp_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    with pytest.raises(TrainEnvError, match="no convert_lora_to_gguf.py in other"):
        await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=str(tmp_path / "other"))
    with pytest.raises(TrainEnvError, match="neither a URL nor a file or directory"):
        await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=str(tmp_path / "gone"))
    with pytest.raises(TrainEnvError, match="is not a llama.cpp version"):
        await trainenv.ensure_converter(tmp_path / "ft", "../b6000", source=str(tmp_path))


async def test_an_archive_leaving_its_directory_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"# lora\n"
        info = tarfile.TarInfo("../convert_lora_to_gguf.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(TrainEnvError, match="evil.tar.gz is refused: .*'\\.\\.' component"):
        await trainenv.ensure_converter(tmp_path / "ft", "b6000", source=str(archive))
    assert not (tmp_path / "convert_lora_to_gguf.py").exists()


# --- the trainer script ----------------------------------------------------------------

# What the trainer's environment holds besides the standard library.
ENVIRONMENT = {"torch", "peft", "transformers", "safetensors", "accelerate", "__future__"}


def test_the_trainer_script_imports_only_what_its_environment_holds() -> None:
    """It runs where llmgw is not installed: an import of llmgw (or of anything the
    environment lacks) would fail only on a node."""
    source = trainenv.trainer_script().decode()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import: the script runs on its own"
            imported.add((node.module or "").split(".")[0])
    assert imported - ENVIRONMENT - set(sys.stdlib_module_names) == set()
    assert {"torch", "peft", "transformers"} <= imported


async def test_the_agents_converter_source_is_where_the_kit_takes_the_scripts_from(
    tmp_path: Path,
) -> None:
    # An offline node: `converter_source` (agent.yaml or ctl config) names a source
    # archive on its mirror or disk; GitHub is never asked.
    archive = tar_of(llama_tree(tmp_path / "tree"), tmp_path / "src.tgz", "llama.cpp-x")
    kit = TrainEnvKit(tmp_path / "trainer", converter_source=str(archive))
    said: list[str] = []
    script = await kit.converter(said.append)
    assert_taken(script, tmp_path / "trainer" / f"llama.cpp-{trainenv.LLAMACPP_PIN}")
    assert any(str(archive) in words for words in said)
    assert not any("github.com" in words for words in said)
