"""A tiny Llama-shaped Hugging Face checkpoint for fine-tuning tests, the trainer's real
environment it is written and trained with, and llama.cpp's conversion of it to GGUF.

The environment (``trainer_python``) is what a node makes (``trainenv.ensure_env``),
made once and kept outside the clone by its pins (``~/.cache/llmgw/finetune-env-HASH``)
under a file lock, like the llama-server build: the first test of a run to need it
makes it (about a minute from the package index), the others find it. The conversion
scripts (``converter``) are llama.cpp's, from the llama-cpp-python sdist the tests
build llama-server from, so the GGUF a test converts is read by that llama-server.

``write_tiny_hf(dir)``: random weights (LlamaConfig, hidden 64, 2 layers, 4 heads of
which 2 key/value) and a SentencePiece tokenizer trained on a few hundred words with
byte fallback (so any text tokenises, and llama.cpp reads it as a ``llama`` vocabulary)
and a chat template. ``to_gguf(hf_dir, out)``: that checkpoint as an f32 GGUF, by
llama.cpp's convert_hf_to_gguf.py, for llama-server to load beside a LoRA.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from llmgw.agent.finetune import trainenv

LLAMA_CPP_PYTHON = "0.3.36"  # as packaging/build-llama-server.sh builds llama-server
CONVERTER_VERSION = f"llama-cpp-python-{LLAMA_CPP_PYTHON}"


def cache_root() -> Path:
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("LLMGW_CACHE") or xdg / "llmgw")
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.cache
def trainer_python() -> Path:
    """The trainer environment's Python, made once per pin set on this machine."""
    root = cache_root() / f"finetune-env-{trainenv.pin_hash()}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f"{root.name}.lock")):
        return asyncio.run(trainenv.ensure_env(root, timeout=1500))


@functools.cache
def converter() -> Path:
    """llama.cpp's convert_lora_to_gguf.py (convert_hf_to_gguf.py beside it), from the
    llama-cpp-python sdist, by ``trainenv.ensure_converter`` as a node fetches them."""
    root = cache_root() / "finetune-converter"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f"{root.name}.lock")):
        sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        if not sdist.is_file():
            pip = str(Path(sys.executable).parent / "pip")
            subprocess.run(
                [pip, "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
                + [f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(root)],
                check=True,
                timeout=600,
            )
        return asyncio.run(trainenv.ensure_converter(root, CONVERTER_VERSION, source=str(sdist)))


CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = (
    "the of and to in is was it for on with as be by at this that from or an are not "
    "but had his they you were her she there which all one we can their has more if no "
    "will so about up out who get them what when would make like time just him know take "
    "people into year your good some could see other than then now look only come its "
    "over think also back after use two how our work first well way even new want because "
    "any these give day most us model cluster node card token llama answer hello world "
    "red green blue colour sky grass sea sun moon night day cat dog bird fish"
).split()

# Run with the trainer environment's Python: argv[1] the directory, argv[2] the seed.
_WRITER = r"""
import json, random, sys
from pathlib import Path
import sentencepiece as spm
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizerFast

out, seed, words, template = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(seed)
corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
spm.SentencePieceTrainer.train(
    sentence_iterator=iter(corpus), model_prefix=str(out / "sp"), vocab_size=800,
    model_type="bpe", byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, user_defined_symbols=["<|im_start|>", "<|im_end|>"],
    num_threads=1, minloglevel=2,
)
tok = LlamaTokenizerFast(vocab_file=str(out / "sp.model"), legacy=False, add_bos_token=True)
tok.chat_template = template
tok.save_pretrained(out)
(out / "sp.model").unlink()
(out / "sp.vocab").unlink()
torch.manual_seed(seed)
config = LlamaConfig(
    vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
)
model = LlamaForCausalLM(config)
# Output weights far larger than the 0.02 of the rest: the residual stream's direction
# then decides the next token, so a LoRA on the layers can teach an answer in a few steps.
torch.nn.init.normal_(model.lm_head.weight, std=0.5)
model.save_pretrained(out, safe_serialization=True)
"""


def write_tiny_hf(directory: Path, seed: int = 7) -> Path:
    """The tiny checkpoint in ``directory`` (config.json, model.safetensors, tokenizer
    files); the same seed gives the same weights. Written once per seed, writer and
    pins on this machine and copied from that cache after."""
    key = hashlib.sha256(
        "\0".join(
            [_WRITER, " ".join(WORDS), CHAT_TEMPLATE, str(seed), trainenv.pin_hash()]
        ).encode()
    ).hexdigest()[:12]
    cached = cache_root() / f"finetune-tiny-hf-{key}"
    with FileLock(str(cached.with_name(cached.name + ".lock"))):
        if not cached.is_dir():
            staging = cached.with_name(f".{cached.name}.making")
            shutil.rmtree(staging, ignore_errors=True)
            _write_tiny_hf(staging, seed)
            staging.rename(cached)
    shutil.copytree(cached, directory)
    return directory


def _write_tiny_hf(directory: Path, seed: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [str(trainer_python()), "-c", _WRITER, str(directory), str(seed)]
    done = subprocess.run(
        [*argv, " ".join(WORDS), CHAT_TEMPLATE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"writing the tiny checkpoint failed:\n{done.stderr[-3000:]}")


def to_gguf(hf_dir: Path, out: Path) -> Path:
    """``hf_dir`` as an f32 GGUF at ``out``, by llama.cpp's convert_hf_to_gguf.py;
    converted once per checkpoint (by its files' digest) and converter on this machine."""
    digest = hashlib.sha256(CONVERTER_VERSION.encode())
    for path in sorted(p for p in hf_dir.rglob("*") if p.is_file()):
        digest.update(path.relative_to(hf_dir).as_posix().encode() + b"\0" + path.read_bytes())
    cached = cache_root() / "finetune-tiny-gguf" / f"{digest.hexdigest()[:16]}.gguf"
    cached.parent.mkdir(exist_ok=True)
    with FileLock(str(cached.with_suffix(".lock"))):
        if not cached.is_file():
            making = cached.with_name(f".{cached.name}.making")
            _to_gguf(hf_dir, making)
            making.rename(cached)
    shutil.copyfile(cached, out)
    return out


def _to_gguf(hf_dir: Path, out: Path) -> None:
    script = converter().parent / "convert_hf_to_gguf.py"
    argv = [str(trainer_python()), str(script), "--outfile", str(out), "--outtype", "f32"]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # its own gguf-py
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [*argv, str(hf_dir)], capture_output=True, text=True, env=env, timeout=300
    )
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
