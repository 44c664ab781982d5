"""A tiny multimodal projector for the tiny model (``tinymodel.py``): llama.cpp's
LLaVA-style "mlp" projector, the smallest its clip loader takes.

One vision block 32 wide over a 16-pixel image cut in 8-pixel patches: an image is 4
tokens of the language model's 64-wide embedding (``mm.2`` maps onto it; llama.cpp
refuses a projector whose output is not the model's width). Random weights: what the
model then says of an image means nothing, only that the image reached it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.support.tinymodel import N_EMBD

WIDTH = 32
FF = 64
PATCH = 8
IMAGE = 16
# Tokens one image becomes: (IMAGE / PATCH) squared patches, one token each.
IMAGE_TOKENS = (IMAGE // PATCH) ** 2


def write_tiny_projector(path: Path, seed: int = 5) -> Path:
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FF)
    writer.add_uint32("clip.vision.block_count", 1)
    writer.add_uint32("clip.vision.projection_dim", N_EMBD)
    writer.add_uint32("clip.vision.attention.head_count", 2)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.image_size", IMAGE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    # Shapes as numpy holds them: ggml's dimensions reversed.
    writer.add_tensor("v.patch_embd.weight", rand(WIDTH, 3, PATCH, PATCH))
    writer.add_tensor("v.position_embd.weight", rand(IMAGE_TOKENS, WIDTH))
    shapes = {
        "attn_q": (WIDTH, WIDTH),
        "attn_k": (WIDTH, WIDTH),
        "attn_v": (WIDTH, WIDTH),
        "attn_out": (WIDTH, WIDTH),
        "ffn_up": (FF, WIDTH),
        "ffn_down": (WIDTH, FF),
    }
    for name, shape in shapes.items():
        writer.add_tensor(f"v.blk.0.{name}.weight", rand(*shape))
        writer.add_tensor(f"v.blk.0.{name}.bias", zeros(shape[0]))
    for norm in ("ln1", "ln2"):
        writer.add_tensor(f"v.blk.0.{norm}.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"v.blk.0.{norm}.bias", zeros(WIDTH))
    writer.add_tensor("mm.0.weight", rand(N_EMBD, WIDTH))
    writer.add_tensor("mm.0.bias", zeros(N_EMBD))
    writer.add_tensor("mm.2.weight", rand(N_EMBD, N_EMBD))
    writer.add_tensor("mm.2.bias", zeros(N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
