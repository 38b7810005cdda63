"""How each llama.cpp architecture maps onto a transformers one: the class, and the tensor names
llama.cpp's converter (convert_hf_to_gguf.py, gguf-py's tensor_mapping.py) gave it, read backwards."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """How one llama.cpp architecture maps onto a transformers architecture."""

    architecture: str  # transformers' class name, the key of architectures.ARCHITECTURES
    permute_qk: bool = False  # llama.cpp permuted q/k rows (LlamaModel.permute in its converter)
    names: dict[str, str] = field(default_factory=dict)  # layer names that differ from LAYER_NAMES
    norm_shift: float = 0.0  # llama.cpp stores norm weights plus this (Gemma: 1 + weight)
    model_type: str | None = None  # config.json's model_type, where it is not the GGUF architecture
    # Config keys the family reads from `{arch}.<metadata key>` when present.
    keys: dict[str, str] = field(default_factory=dict)
    # llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or for the 27B (this many layers) by
    # 1/sqrt(hidden/heads) (llama-model.cpp, f_attention_scale); the file stores no query_pre_attn_scalar.
    layers_27b: int | None = None
    partial_rotary: bool = False  # rope.dimension_count gives partial_rotary_factor (Phi-4-mini's 0.75)


GEMMA_NAMES = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"}
WINDOW = {"sliding_window": "attention.sliding_window"}
FAMILIES = {
    "llama": Family("LlamaForCausalLM", permute_qk=True),
    "qwen2": Family("Qwen2ForCausalLM"),
    "qwen3": Family("Qwen3ForCausalLM"),
    "gemma": Family("GemmaForCausalLM", norm_shift=1.0),  # plain pre-norm layers, no window or soft-cap
    "gemma2": Family("Gemma2ForCausalLM", names=GEMMA_NAMES, norm_shift=1.0, layers_27b=46, keys={
        **WINDOW, "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping"}),
    "gemma3": Family("Gemma3ForCausalLM", names=GEMMA_NAMES, norm_shift=1.0, layers_27b=62, model_type="gemma3_text",
                     keys={**WINDOW, "final_logit_softcapping": "final_logit_softcapping",
                           "rope_local_base_freq": "rope.freq_base_swa"}),
    "phi3": Family("Phi3ForCausalLM", names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
                   partial_rotary=True,
                   keys={**WINDOW, "original_max_position_embeddings": "rope.scaling.original_context_length"}),
}

# llama.cpp's names -> transformers' (gguf-py's tensor_mapping.py, read backwards).
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name: str, family: Family = FAMILIES["llama"]) -> str | None:
    """The transformers name of llama.cpp's tensor `name` (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`), None for one without a counterpart."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    layer_names = {**LAYER_NAMES, **family.names}
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    return None
