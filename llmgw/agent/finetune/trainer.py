"""The trainer: a LoRA fine-tune of a Hugging Face checkpoint on prompt/completion
pairs, run as ``ENV_PYTHON trainer.py SPEC.json`` in the environment trainenv makes.

Self-contained on purpose: the environment holds PyTorch, transformers, PEFT and
safetensors but not llmgw, so this file imports nothing of llmgw; the node's runner
copies it into the job's directory and runs it.

SPEC.json: ``model_dir`` (config.json, tokenizer, *.safetensors), ``data`` (the pairs,
JSONL), ``out``, ``epochs``, ``rank``, ``alpha`` (2 x rank when null), ``lr`` (2e-4
when null), ``max_len`` (512 tokens when null), ``device`` (cpu or cuda),
``convert`` (llama.cpp's convert_lora_to_gguf.py, or null) and ``seed``.

Each line of the pairs is ``{"prompt": str, "completion": str}``, or
``{"messages": [{"role", "content"}, ...]}`` ending with the assistant's message, which
is the completion; the messages before it go through the tokenizer's chat template
(with its generation prompt) when it has one. The loss is on the completion's tokens
only. A line that is none of these stops the run before the model is loaded, naming
the line.

Stdout carries only the events, one JSON object a line (everything else the libraries
print goes to stderr): ``start`` (steps, pairs), ``step`` (step, loss, peak_mib) after
each optimiser step, ``saved`` (the PEFT directory ``out/adapter``), ``converted``
(``out/adapter.gguf``) and ``error`` (reason). Exit 0 only when it finished.

The same seed, data and spec give the same steps and losses on the same device: the
order of pairs per epoch comes from the seed, and so does the adapter's start.
On the CPU the model trains in float32; on CUDA in bfloat16 where the card has it
(float32 otherwise), the adapter's weights in float32 either way.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

BATCH = 4
DEFAULT_LR = 2e-4
DEFAULT_MAX_LEN = 512
MAX_DATA_BYTES = 32 << 20
MAX_LINES = 100_000
ROLES = ("system", "user", "assistant", "tool")

# The events' stream: the real stdout, kept apart before any library can print on it.
_events = sys.stdout


class Refusal(Exception):
    """A spec or data the trainer cannot use; the message says which and why."""


def emit(event: str, **fields: Any) -> None:
    _events.write(json.dumps({"event": event, **fields}) + "\n")
    _events.flush()


# --- the spec and the pairs ---------------------------------------------------------


def read_spec(path: Path) -> dict[str, Any]:
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise Refusal(f"the spec {path} cannot be read: {exc}") from exc
    if not isinstance(spec, dict):
        raise Refusal(f"the spec {path} is not a JSON object")
    for key in ("model_dir", "data", "out"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise Refusal(f"the spec's {key} must be a path")
    for key, low in (("epochs", 1), ("rank", 1), ("seed", 0)):
        if not isinstance(spec.get(key), int) or spec[key] < low:
            raise Refusal(f"the spec's {key} must be an integer of at least {low}")
    for key in ("alpha", "max_len"):
        if spec.get(key) is not None and (not isinstance(spec[key], int) or spec[key] < 1):
            raise Refusal(f"the spec's {key} must be a positive integer or null")
    lr = spec.get("lr")
    if lr is not None and (not isinstance(lr, (int, float)) or not 0 < lr < 1):
        raise Refusal("the spec's lr must be a number between 0 and 1, or null")
    if spec.get("device") not in ("cpu", "cuda"):
        raise Refusal("the spec's device must be cpu or cuda")
    convert = spec.get("convert")
    if convert is not None and not (isinstance(convert, str) and Path(convert).is_file()):
        raise Refusal(f"the spec's convert {convert!r} is not a file (convert_lora_to_gguf.py)")
    if not (Path(spec["model_dir"]) / "config.json").is_file():
        raise Refusal(f"the base model's directory {spec['model_dir']} holds no config.json")
    return spec


Pair = tuple[int, list[dict[str, str]] | None, str, str]  # line, messages, prompt, completion


def read_pairs(path: Path) -> list[Pair]:
    """Every pair in the file, with its line number; Refusal naming the first bad line."""
    try:
        size = path.stat().st_size
        if size > MAX_DATA_BYTES:
            raise Refusal(f"the pairs file is {size >> 20} MiB, past the 32 MiB allowed")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(f"the pairs file is not UTF-8 text ({exc})") from exc
    except OSError as exc:
        raise Refusal(f"the pairs file cannot be read: {exc}") from exc
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise Refusal(f"the pairs file has {len(lines)} lines, past the {MAX_LINES} allowed")
    pairs = [pair_of(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not pairs:
        raise Refusal("the pairs file holds no pairs (one JSON object a line)")
    return pairs


def pair_of(number: int, line: str) -> Pair:
    where = f"line {number} of the pairs"
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise Refusal(f"{where} is not JSON: {exc}") from exc
    if not isinstance(item, dict):
        raise Refusal(f"{where} is not a JSON object")
    if "messages" in item:
        messages = item["messages"]
        if not isinstance(messages, list) or not messages:
            raise Refusal(f"{where}: messages must be a list of {{role, content}} objects")
        for m in messages:
            ok = isinstance(m, dict) and m.get("role") in ROLES
            if not ok or not isinstance(m.get("content"), str):
                raise Refusal(
                    f"{where}: each message needs a role ({', '.join(ROLES)}) and a string content"
                )
        if messages[-1]["role"] != "assistant" or not messages[-1]["content"]:
            raise Refusal(f"{where}: the last message must be the assistant's, not empty")
        return (number, messages, "", messages[-1]["content"])
    prompt, completion = item.get("prompt"), item.get("completion")
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise Refusal(f"{where} needs a string prompt and completion (or a messages list)")
    if not completion:
        raise Refusal(f"{where}: the completion is empty; there is nothing to learn")
    return (number, None, prompt, completion)


# --- tokens -------------------------------------------------------------------------


def encode(tok: Any, pair: Pair, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 on the prompt: no loss there) of one pair."""
    _, messages, prompt, completion = pair
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    if messages is not None and getattr(tok, "chat_template", None):
        before = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        whole = tok.apply_chat_template(messages, tokenize=False)
        # The template closes the assistant's turn itself (its end-of-turn token).
        said = whole[len(before) :] if whole.startswith(before) else completion
        prompt_ids = tok(before, add_special_tokens=False)["input_ids"]
        answer_ids = tok(said, add_special_tokens=False)["input_ids"]
    else:
        if messages is not None:
            turns = [f"{m['role']}: {m['content']}" for m in messages[:-1]]
            prompt = "\n".join([*turns, "assistant: "])
        prompt_ids = tok(prompt, add_special_tokens=True)["input_ids"]
        answer_ids = tok(completion, add_special_tokens=False)["input_ids"] + eos
    if len(prompt_ids) + len(answer_ids) > max_len:
        # The end of a long prompt is what the answer follows from.
        keep = min(len(prompt_ids), max(max_len - len(answer_ids), max_len // 2))
        prompt_ids = prompt_ids[len(prompt_ids) - keep :]
        answer_ids = answer_ids[: max_len - keep]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def batches(encoded: list[tuple[list[int], list[int]]], order: list[int], pad: int) -> list[Any]:
    import torch

    out = []
    for start in range(0, len(order), BATCH):
        group = [encoded[i] for i in order[start : start + BATCH]]
        width = max(len(ids) for ids, _ in group)
        ids = [a + [pad] * (width - len(a)) for a, _ in group]
        labels = [b + [-100] * (width - len(b)) for _, b in group]
        mask = [[1] * len(a) + [0] * (width - len(a)) for a, _ in group]
        out.append((torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)))
    return out


# --- training -----------------------------------------------------------------------


def peak_mib(device: str) -> float:
    import torch

    if device == "cuda":
        return round(float(torch.cuda.max_memory_allocated()) / (1 << 20), 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


def train(spec: dict[str, Any], pairs: list[Pair]) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = spec["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise Refusal("the spec asks for cuda, but PyTorch sees no card on this node")
    seed = spec["seed"]
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    dtype = torch.float32
    if device == "cuda" and torch.cuda.is_bf16_supported():
        dtype = torch.bfloat16
    model_dir = spec["model_dir"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    max_len = spec.get("max_len") or DEFAULT_MAX_LEN
    encoded = [encode(tok, pair, max_len) for pair in pairs]
    for pair, (_, labels) in zip(pairs, encoded, strict=True):
        if all(label == -100 for label in labels):
            raise Refusal(f"line {pair[0]} of the pairs: its completion has no tokens left")
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device)
    rank = spec["rank"]
    config = LoraConfig(
        r=rank,
        lora_alpha=spec.get("alpha") or 2 * rank,
        lora_dropout=0.0,  # dropout would make the losses depend on more than the seed
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=spec.get("lr") or DEFAULT_LR, weight_decay=0.0)

    per_epoch = math.ceil(len(encoded) / BATCH)
    steps = per_epoch * spec["epochs"]
    emit("start", steps=steps, pairs=len(pairs))
    shuffle = random.Random(seed)
    step = 0
    for _ in range(spec["epochs"]):
        order = list(range(len(encoded)))
        shuffle.shuffle(order)
        for ids, labels, mask in batches(encoded, order, pad):
            ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
            if not torch.isfinite(loss):
                raise Refusal(f"the loss went to {loss.item()} at step {step + 1}; lower lr")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            step += 1
            emit("step", step=step, loss=round(loss.item(), 6), peak_mib=peak_mib(device))

    adapter = Path(spec["out"]) / "adapter"
    model.save_pretrained(str(adapter), safe_serialization=True)
    emit("saved", dir=str(adapter))
    return adapter


def convert(spec: dict[str, Any], adapter: Path) -> Path:
    gguf = Path(spec["out"]) / "adapter.gguf"
    argv = [sys.executable, spec["convert"], "--base", spec["model_dir"]]
    argv += ["--outfile", str(gguf), "--outtype", "f16", str(adapter)]
    # Its output is the job's log (stderr); stdout is the events'.
    done = subprocess.run(argv, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0 or not gguf.is_file():
        last = [line for line in done.stderr.splitlines() if line.strip()][-3:]
        said = " | ".join(last) or f"exit {done.returncode}"
        raise Refusal(f"convert_lora_to_gguf.py failed: {said}")
    return gguf


def main(argv: list[str]) -> int:
    global _events
    # Anything a library prints goes to stderr; the events keep the real stdout.
    _events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is on disk: no hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    try:
        if len(argv) != 1:
            raise Refusal("usage: trainer.py SPEC.json")
        spec = read_spec(Path(argv[0]))
        pairs = read_pairs(Path(spec["data"]))
        Path(spec["out"]).mkdir(parents=True, exist_ok=True)
        adapter = train(spec, pairs)
        if spec.get("convert"):
            emit("converted", gguf=str(convert(spec, adapter)))
    except Refusal as exc:
        emit("error", reason=str(exc))
        return 1
    except Exception as exc:  # any other failure still ends in an event saying it
        emit("error", reason=f"{type(exc).__name__}: {exc}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
