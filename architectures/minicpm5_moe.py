"""MiniCPM5-MoE (MiniCPM5MoeForCausalLM): Llama's layer with a gated attention and DeepSeek-V3's experts.

Reference: transformers/models/minicpm5_moe/modular_minicpm5_moe.py. What differs from the
families it is assembled from:
- the attention is Llama's (no q/k norms, the whole head rotated, GQA) with an output gate: the
  checkpoint's `q_proj` (transformers renames it `q_gate_proj` on load) gives per head its query
  then its gate (head_dim each), and the attention output is multiplied by sigmoid(gate) before
  o_proj (Qwen3.5's gated attention, builder/blocks/gated_attention.py);
- the MLP is DeepSeek-V3's, the math of GLM-4.5's (architectures/glm4_moe.py, imported): the
  grouped sigmoid router with its correction bias in float32, the routed experts, and
  `n_shared_experts` shared experts, added; which layers are sparse is `mlp_layer_types`
  ("dense"/"sparse"; without it, dense below config.json's `first_k_dense_replace`, 1 unless given);
- no multi-token-prediction layers; a rotary theta of 5e6 unless config.json says otherwise.
`attention_bias`: biases on q_proj (the query's and the gate's rows alike), k, v and o.
Refused: `use_gated_attention: false` (transformers refuses it), fewer `mlp_layer_types` than layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from architectures.glm4_moe import Glm4MoeConfig, layer_with
from builder.architecture import Weights
from builder.blocks import AttentionSpec, AttentionWeights
from builder.blocks.gated_attention import gated_self_attention, split_query_gate
from builder.family import Decoder, Family, ModelType, register

# MiniCPM5MoeConfig's defaults (first_k_dense_replace: the default of the key its __post_init__ reads).
VARIANTS: dict[str, dict[str, Any]] = {
    "MiniCPM5MoeForCausalLM": dict(
        model_type="minicpm5_moe", vocab_size=130560, hidden_size=2048, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, max_position_embeddings=524288,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=[1, 130073], pad_token_id=1,
        moe_intermediate_size=512, num_experts_per_tok=16, n_shared_experts=1, n_routed_experts=160,
        routed_scaling_factor=3.66, n_group=1, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1,
        default_theta=5_000_000.0,
    ),
}

# The hub's config.json says MiniCPM5MoEForCausalLM (the remote code's class), which
# MiniCPM5MoeConfig renames: its model_type selects this row whatever the class is spelled.
MODEL_TYPES = {"minicpm5_moe": ModelType("MiniCPM5MoeForCausalLM")}

# onnxruntime-genai 0.18 knows no minicpm5_moe; the output gate changes nothing in Llama's decoder
# contract (inputs, outputs, KV cache), so genai runs it as "llama". The modeling file has no window,
# no q/k norms and no next-token layers.
STRUCTURE: dict[str, dict[str, Any]] = {
    "MiniCPM5MoeForCausalLM": dict(model_type="llama", sliding_window=None, layer_types=None, use_qk_norm=False,
                                   num_nextn_predict_layers=0),
}


@dataclass(frozen=True)
class MiniCPM5MoeConfig(Glm4MoeConfig):
    """config.json of MiniCPM5MoeForCausalLM: GLM-4.5's expert keys, the sparse layers by name."""

    mlp_layer_types: list[str] | None = None
    use_gated_attention: bool = True

    def __post_init__(self) -> None:
        if self.mlp_layer_types is None:  # MiniCPM5MoeConfig.__post_init__
            object.__setattr__(self, "mlp_layer_types", ["dense" if i < self.first_k_dense_replace else "sparse"
                                                         for i in range(self.num_hidden_layers)])
        if len(self.mlp_layer_types) < self.num_hidden_layers:  # transformers' layers index past its end
            raise ValueError(f"mlp_layer_types has {len(self.mlp_layer_types)} entries for "
                             f"{self.num_hidden_layers} layers")
        if not self.use_gated_attention:
            raise ValueError("use_gated_attention false: MiniCPM5-MoE always gates its attention (transformers "
                             "refuses it too)")
        super().__post_init__()
        if self.n_routed_experts // self.n_group < 2:  # one group too is scored by its best two (torch.topk(2))
            raise ValueError(f"{self.n_routed_experts} expert(s) in {self.n_group} group(s): the group score needs "
                             "two per group")

    def sparse(self, layer: int) -> bool:
        """MiniCPM5MoeDecoderLayer.__init__: experts where mlp_layer_types says "sparse", else dense."""
        return self.mlp_layer_types[layer] == "sparse"


def attention(d: Decoder, a: Weights, i: int, h):
    """MiniCPM5MoeAttention.forward: GQA over q, k, v, its output times sigmoid(gate), then o_proj."""
    c = d.c
    H, D, heads, kv_dim = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads * c.head_dim
    query, gate = split_query_gate(a("q_proj.weight", 2 * heads * D, H), heads, D)
    biases, gate_bias = {}, None
    if c.attention_bias:
        q_bias, gate_bias = split_query_gate(a("q_proj.bias", 2 * heads * D), heads, D)
        biases = dict(q_bias=q_bias, k_bias=a("k_proj.bias", kv_dim), v_bias=a("v_proj.bias", kv_dim),
                      o_bias=a("o_proj.bias", H))
    weights = AttentionWeights(q=query, k=a("k_proj.weight", kv_dim, H), v=a("v_proj.weight", kv_dim, H),
                               o=a("o_proj.weight", H, heads * D), **biases)
    spec = AttentionSpec(heads, c.num_key_value_heads, D, norm_eps=c.rms_norm_eps)
    return gated_self_attention(d.g, h, d.past(i), d.lengths, d.rotary, weights, gate, spec, d.target,
                                gate_bias)


# MiniCPM5MoeDecoderLayer.forward: GLM-4.5's layer with this attention; returns the layer's KV.
decoder_layer = layer_with(attention)


FAMILY = register(Family(
    "minicpm5_moe", MiniCPM5MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, model_types=MODEL_TYPES,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "MiniCPM5MoeConfig", "decoder_layer"]
