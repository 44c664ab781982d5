"""A tiny llama-architecture GGUF that llama-server loads and answers with.

Two layers, a 64-wide embedding and a vocabulary of a few hundred SentencePiece tokens
(every byte token included, so any text tokenises), a chat template, a few hundred KB.
Random weights would happily emit byte and control tokens, which turn chat output into
broken UTF-8; so one embedding dimension is held constant through every layer and the
output weights on it push those tokens' logits far down: the model only ever says words.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
N_CTX = 512
HEAD_DIM = N_EMBD // N_HEAD

WORDS = (
    "the of and to in is was it for on with as be by at this that from or an are not "
    "but had his they you were her she there which all one we can their has more if no "
    "will so about up out who get them what when would make like time just him know take "
    "people into year your good some could see other than then now look only come its "
    "over think also back after use two how our work first well way even new want because "
    "any these give day most us model cluster node card token llama answer hello world"
).split()

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

NORMAL = gguf.TokenType.NORMAL
CONTROL = gguf.TokenType.CONTROL
BYTE = gguf.TokenType.BYTE
UNKNOWN = gguf.TokenType.UNKNOWN


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces = ["▁" + w for w in WORDS] + list("abcdefghijklmnopqrstuvwxyz") + ["▁"]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    scores = [0.0] * len(tokens)
    # SentencePiece prefers higher scores when merging: whole words first.
    for i, tok in enumerate(tokens):
        if types[i] == NORMAL:
            scores[i] = -float(len(tokens) - len(tok))
    return tokens, scores, [int(t) for t in types]


def write_tiny_model(path: Path, seed: int = 7, context: int = N_CTX) -> Path:
    """Write the model to ``path``; the same seed gives the same bytes. ``context``: the
    context it says it was trained for (its positions are RoPE's: any length works)."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    embd = rand(n_vocab, N_EMBD)
    embd[:, 0] = 4.0  # the constant dimension the output bias rides on
    writer.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rand(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", rand(HEAD_DIM * N_HEAD_KV, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", rand(HEAD_DIM * N_HEAD_KV, N_EMBD))
        attn_out = rand(N_EMBD, N_EMBD)
        attn_out[0, :] = 0.0  # layers never touch the constant dimension
        writer.add_tensor(f"blk.{i}.attn_output.weight", attn_out)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        down = rand(N_EMBD, N_FF)
        down[0, :] = 0.0
        writer.add_tensor(f"blk.{i}.ffn_down.weight", down)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    output = rand(n_vocab, N_EMBD, scale=0.5)
    banned = np.array([t != NORMAL for t in types])
    output[banned, 0] = -8.0
    output[~banned, 0] = 0.0
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


LORA_RANK = 4
LORA_WORD = "cluster"


def write_tiny_lora(path: Path, word: str = LORA_WORD, seed: int = 11) -> Path:
    """A LoRA adapter of the tiny model, as llama.cpp's convert_lora_to_gguf.py writes
    one (``general.type`` adapter, ``adapter.type`` lora, ``adapter.lora.alpha``, each
    adapted weight as ``NAME.lora_a`` (rank x in) and ``NAME.lora_b`` (out x rank)).

    Applied, it makes the model say ``word`` and nothing else: its ``output.weight``
    pair reads the constant dimension and adds to that word's logit alone (the banned
    tokens' rows untouched), far past every other word's. Alpha equals the rank, so a
    request's scale is the scale applied. Its ``attn_q`` pairs are small and random:
    there to be loaded, not to decide anything."""
    rng = np.random.default_rng(seed)
    tokens, _, _ = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(LORA_RANK))
    for i in range(N_LAYER):
        a = (rng.standard_normal((LORA_RANK, N_EMBD)) * 0.01).astype(np.float32)
        b = (rng.standard_normal((N_EMBD, LORA_RANK)) * 0.01).astype(np.float32)
        writer.add_tensor(f"blk.{i}.attn_q.weight.lora_a", a)
        writer.add_tensor(f"blk.{i}.attn_q.weight.lora_b", b)
    a = np.zeros((LORA_RANK, N_EMBD), dtype=np.float32)
    a[0, 0] = 1.0  # the constant dimension (about 8 once normed)
    b = np.zeros((len(tokens), LORA_RANK), dtype=np.float32)
    b[tokens.index("▁" + word), 0] = 8.0
    writer.add_tensor("output.weight.lora_a", a)
    writer.add_tensor("output.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    import sys

    print(write_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf")))
