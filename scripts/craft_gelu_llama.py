"""A worked example of crafting a model with builder's Python API: a Llama checkpoint rebuilt with
a different MLP activation (tanh-approximated GELU instead of SiLU).

Nothing here is specific to the registry: the weights come lazily from the safetensors files, the
graph is assembled from blocks, and `save` streams it to disk beside genai_config.json and the
tokenizer, a folder onnxruntime-genai runs. The same pattern mixes blocks of two families, or
feeds another checkpoint's tensors into any block.

    python scripts/craft_gelu_llama.py examples/tiny-llama out/gelu-llama
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from builder import Checkpoint, DecoderIO, Graph, Target, blocks, save


def craft(source: Path, output: Path, activation: str = "gelu_pytorch_tanh", io_dtype=np.float32) -> Path:
    config = json.loads((source / "config.json").read_text())
    H, V, I = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    D = config.get("head_dim") or H // heads
    layers, eps = config["num_hidden_layers"], config.get("rms_norm_eps", 1e-6)
    ckpt = Checkpoint.open(source)
    target = Target(io_dtype=np.dtype(io_dtype))

    g = Graph()
    io = DecoderIO.create(layers, kv_heads, D, target.io_dtype)
    rope = blocks.Rope.from_parameters({"rope_theta": config.get("rope_theta", 10000.0)}, D, config["max_position_embeddings"])
    rotary = blocks.rotary_tables(g, rope, config["max_position_embeddings"], target)
    lengths = blocks.sequence_lengths(g, io.attention_mask)
    tied = config.get("tie_word_embeddings", False)
    embed = ckpt.weight("model.embed_tokens.weight")
    vocab = blocks.Vocabulary.create(g, embed, embed if tied else ckpt.weight("lm_head.weight"), tied, target)
    stream = blocks.ResidualStream(g, vocab.embed(g, io.input_ids), eps, target)
    presents = []
    for i in range(layers):
        p = f"model.layers.{i}."
        with g.scope("model", f"layers.{i}"):
            with g.scope("input_layernorm"):
                h = stream.norm(ckpt.weight(p + "input_layernorm.weight"))
            weights = blocks.AttentionWeights(
                q=ckpt.weight(p + "self_attn.q_proj.weight"), k=ckpt.weight(p + "self_attn.k_proj.weight"),
                v=ckpt.weight(p + "self_attn.v_proj.weight"), o=ckpt.weight(p + "self_attn.o_proj.weight"),
            )
            with g.scope("self_attn"):
                h, pk, pv = blocks.self_attention(
                    g, h, io.past[i], lengths, rotary, weights, blocks.AttentionSpec(heads, kv_heads, D), target
                )
            presents.append((pk, pv))
            stream.add(h)
            with g.scope("post_attention_layernorm"):
                h = stream.norm(ckpt.weight(p + "post_attention_layernorm.weight"))
            with g.scope("mlp"):  # the one change: another activation in the gated MLP
                stream.add(blocks.gated_mlp(
                    g, h, ckpt.weight(p + "mlp.gate_proj.weight", (I, H)), ckpt.weight(p + "mlp.up_proj.weight", (I, H)),
                    ckpt.weight(p + "mlp.down_proj.weight", (H, I)), activation, target,
                ))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight"))
    logits = vocab.logits(g, h)
    ckpt.check_consumed()  # every tensor used: nothing silently dropped
    return save(g.model(io.inputs, io.outputs(logits, V, presents)), output, overwrite=True, source=source, target=target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(craft(Path(sys.argv[1]), Path(sys.argv[2])))
