"""IBM Granite 3 (GraniteForCausalLM) and Granite MoE (GraniteMoeForCausalLM): Llama's decoder with
four scalar multipliers.

Reference: transformers/models/granite{,moe}/modeling_granite{,moe}.py. Apart from Llama:
- the embeddings are multiplied by `embedding_multiplier`;
- each branch joins the residual scaled: x + h · `residual_multiplier`;
- the attention scale is `attention_multiplier` (not 1/√head_dim);
- the logits are divided by `logits_scaling`.
Granite MoE's MLP is Mixtral's sparse block (`block_sparse_moe`): softmax over the top-k router
logits, which is ONNX Runtime's MoE router exactly (builder/blocks/moe.py); its checkpoints stack
the experts (`input_linear` [E, 2I, H], gate rows then up rows; `output_linear` [E, H, I]).
Scales on activations stay in the graph (the weights are written as they are, so quantization
rounds the checkpoint's own values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    gated_mlp,
    rotary_tables,
    self_attention,
    sequence_lengths,
    sparse_moe,
)
from builder.blocks.moe import unstacked
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO, logits_dtype
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"GraniteForCausalLM": {}, "GraniteMoeForCausalLM": dict(model_type="granitemoe")}

# genai 0.18 has no "granitemoe"; "granite" is the same decoder contract (a plain KV-cache decoder).
STRUCTURE: dict[str, dict[str, Any]] = {"GraniteForCausalLM": {}, "GraniteMoeForCausalLM": dict(model_type="granite",
                                                                                                 moe=True)}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class GraniteConfig:
    """config.json of GraniteForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "granite"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # not a GraniteConfig field, but read when config.json has it
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    mlp_bias: bool = False
    embedding_multiplier: float = 1.0
    logits_scaling: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    num_local_experts: int = 8  # GraniteMoeConfig's
    num_experts_per_tok: int = 2
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    moe: bool = False  # the modeling file's: a sparse block of experts in place of the MLP

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    def window(self, layer: int) -> int | None:
        return None


def parse_config(raw: dict[str, Any], architecture: str) -> GraniteConfig:
    max_pos = raw.get("max_position_embeddings", 2048)
    return from_dict(GraniteConfig, raw, VARIANTS[architecture], rope_parameters=rope_parameters(raw, max_pos),
                     **STRUCTURE[architecture])


def mlp(g: Graph, h, w: Weights, c: GraniteConfig, target: Target):
    """GraniteMLP.forward, or GraniteMoeMoE.forward (softmax over the top-k router logits), in its scope."""
    H, I = c.hidden_size, c.intermediate_size
    if c.moe:
        m, E = w.under("block_sparse_moe."), c.num_local_experts
        fused = m("input_linear.weight", E, 2 * I, H)  # (E, 2I, H): chunk(2) gives gate, then up
        return sparse_moe(g, h, m("router.layer.weight", E, H), unstacked(fused, 0, I), unstacked(fused, I),
                          unstacked(m("output_linear.weight", E, H, I)), c.num_experts_per_tok, True, c.hidden_act,
                          target, router_name="router")
    m = w.under("mlp.")
    biases = (m("gate_proj.bias", I), m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else None
    return gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                     c.hidden_act, target, biases)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: GraniteConfig, i: int, past, lengths, rotary,
                  target: Target):
    """GraniteDecoderLayer/GraniteMoeDecoderLayer.forward: x + attn(norm(x)) · m, then x + mlp(norm(x)) · m,
    with m the residual_multiplier; returns the layer's KV."""
    H, D = c.hidden_size, c.head_dim
    def scaled(h):
        return h if c.residual_multiplier == 1 else g.op.Mul(h, g.constant(c.residual_multiplier, target.io_dtype))

    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, scale=c.attention_multiplier)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
        stream.add(scaled(h))
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    with g.scope("block_sparse_moe" if c.moe else "mlp"):
        stream.add(scaled(mlp(g, h, w, c, target)))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: GraniteConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    x = vocab.embed(g, io.input_ids, scale=c.embedding_multiplier if c.embedding_multiplier != 1 else None)
    stream = ResidualStream(g, x, c.rms_norm_eps, target)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (c.hidden_size,)))
    logits = vocab.logits(g, h)
    if c.logits_scaling != 1:
        with g.scope("lm_head"):  # GraniteForCausalLM: logits / logits_scaling
            logits = g.op.Div(logits, g.constant(c.logits_scaling, logits_dtype(target.io_dtype)))
    return logits, presents


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "GraniteConfig", "build", "decoder_layer", "parse_config"]
