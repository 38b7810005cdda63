"""rednote dots.llm1 (Dots1ForCausalLM): GLM-4.5's sparse layers under Qwen3's attention.

Reference: transformers/models/dots1/modular_dots1.py, which assembles it from other families:
- the attention is Qwen3's: per-head q/k RMSNorm always, `attention_bias` on q/k/v and o_proj
  alike, the whole head rotated; layers from `max_window_layers` on slide over `sliding_window`
  (Dots1Config's `layer_types` rule; the hub's configs have no window, so none slide);
- the MLP is DeepSeek-V3's, the math of GLM-4.5's (architectures/glm4_moe.py, imported): dense
  below `first_k_dense_replace`, then the grouped sigmoid router with its correction bias
  (Dots1TopkRouter), the routed experts and `n_shared_experts` shared experts, added;
- no multi-token-prediction layers: an extra layer in a checkpoint is refused as unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from architectures.glm4_moe import Glm4MoeConfig, moe_block
from architectures.moe import dense_mlp, pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register

VARIANTS: dict[str, dict[str, Any]] = {
    "Dots1ForCausalLM": dict(model_type="dots1", vocab_size=152064, hidden_size=4608, intermediate_size=10944,
                             num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=32,
                             max_position_embeddings=2048, rms_norm_eps=1e-6, sliding_window=4096,
                             bos_token_id=None, eos_token_id=None),
}

# onnxruntime-genai 0.18 knows no dots1; its attention is Qwen3's, so genai runs it as "qwen3"
# (Llama's decoder contract: the same inputs, outputs and KV cache). Dots1Attention always has its
# q/k norms, and the modeling file has no next-token layers.
STRUCTURE: dict[str, dict[str, Any]] = {
    "Dots1ForCausalLM": dict(model_type="qwen3", use_qk_norm=True, num_nextn_predict_layers=0),
}

EXPERT_KEYS = ("n_routed_experts", "num_experts_per_tok", "n_shared_experts")


@dataclass(frozen=True)
class Dots1Config(Glm4MoeConfig):
    """config.json of Dots1ForCausalLM: GLM-4.5's keys with Dots1Config's defaults (the shared keys' in
    VARIANTS), and its window."""

    n_shared_experts: int | None = None  # these three have no default in Dots1Config
    n_routed_experts: int | None = None
    num_experts_per_tok: int | None = None
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = False
    max_window_layers: int | None = 62

    def __post_init__(self) -> None:
        if self.num_local_experts is not None:
            object.__setattr__(self, "n_routed_experts", self.num_local_experts)
        missing = [key for key in EXPERT_KEYS if getattr(self, key) is None]
        if missing and self.first_k_dense_replace < self.num_hidden_layers:
            raise ValueError(f"{', '.join(missing)} missing: the sparse layers need them and Dots1Config "
                             "has no default")
        if missing:  # every layer dense, as transformers builds it: no experts to check
            DecoderConfig.__post_init__(self)
            return
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Dots1Config: the layers from max_window_layers on slide when there is a window."""
        last = self.max_window_layers
        if last is None and self.sliding_window is not None:  # transformers fails comparing with None
            raise ValueError("max_window_layers is null: the sliding_window's first layer is unknown")
        return ["sliding_attention" if self.sliding_window is not None and i >= last else "full_attention"
                for i in range(self.num_hidden_layers)]


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Dots1DecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV."""
    c, m, a = d.c, w.under("mlp."), w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias, a)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps)
    if c.sparse(i):
        return pre_norm_layer(d, w, i, attention, spec, lambda h: moe_block(d, h, m))
    return pre_norm_layer(d, w, i, attention, spec, lambda h: dense_mlp(d, h, m, c.intermediate_size))


FAMILY = register(Family(
    "dots1", Dots1Config, decoder_layer, VARIANTS, structure=STRUCTURE,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Dots1Config", "decoder_layer"]
