"""Small GGUF files written from tiny transformers checkpoints, as llama.cpp's converter
(convert_hf_to_gguf.py) writes them: its tensor names, Llama's permuted q/k rows, Gemma's norm
weights plus 1, its metadata keys."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ARCH = {"LlamaConfig": "llama", "Qwen2Config": "qwen2", "Qwen3Config": "qwen3", "GemmaConfig": "gemma",
        "Gemma2Config": "gemma2",
        "Gemma3Config": "gemma3", "Phi3Config": "phi3"}
GEMMA_NAMES = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
ARCH_NAMES = {"gemma2": GEMMA_NAMES, "gemma3": GEMMA_NAMES,
              "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}}
NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
MERGES = ["Ġ t", "h e", "Ġt he"]
VOCAB = 256 + len(MERGES) + 2  # bytes, merges, <|endoftext|> (control), <think> (user-defined)

# SentencePiece vocabularies (`tokenizer.ggml.model` "llama"), in llama.cpp's token types: 1 normal,
# 2 unknown, 3 control, 4 user-defined, 6 byte. Llama 2 / Mistral style: <unk> <s> </s>, the 256
# byte pieces, pieces scored best first, Mistral v0.3's control [INST] [/INST]; digits stay single.
BYTES = [f"<0x{b:02X}>" for b in range(256)]
PIECES = ["▁▁", "▁t", "he", "▁the", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁▁▁▁",
          "in", "▁in", "er", "▁H", "ello", "▁a", "▁▁▁▁▁▁▁▁", "ü", "▁", "e", "t", "h", "l", "o", "w", "r", "d", "a",
          "i", "n", "H", "é", "1", "2", ".", "(", ")", ":"]
LLAMA_SPM = dict(
    tokens=["<unk>", "<s>", "</s>", *BYTES, *PIECES, "[INST]", "[/INST]"],
    types=[2, 3, 3, *[6] * 256, *[1] * len(PIECES), 3, 3],
    scores=[0.0, 0.0, 0.0, *[0.0] * 256, *[-float(i) for i in range(len(PIECES))], 0.0, 0.0],
    bos=1, eos=2, unk=0, pad=None)
# Gemma style: <pad> <eos> <bos> <unk> <mask> first, turn markers user-defined, whitespace pieces
# stored with real spaces (user-defined), no merges and scores that do not give the merge order.
GEMMA_PIECES = ["\n", "\n\n", "▁t", "he", "▁the", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world",
                "in", "▁in", "▁a", "ü", "▁", "e", "t", "h", "l", "o", "w", "r", "d", "a", "i", "n", "u", "s", "m", "1",
                "2", "é", "<", ">", "_"]
GEMMA_SPM = dict(
    tokens=["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "  ", "   ", "    ",
            *BYTES, *GEMMA_PIECES],
    types=[3, 3, 3, 2, 3, 4, 4, 4, 4, 4, *[6] * 256, *[1] * len(GEMMA_PIECES)],
    scores=[0.0] * 10 + [0.0] * 256 + [float(i % 7) for i in range(len(GEMMA_PIECES))],
    bos=2, eos=1, unk=3, pad=0)
SPM = {"llama": LLAMA_SPM, "gemma": GEMMA_SPM}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gguf_name(hf: str, arch: str = "llama") -> str:
    if hf in GLOBAL:
        return GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    names = {**NAMES, **ARCH_NAMES.get(arch, {})}
    return f"blk.{layer}.{names[module]}.{kind}"


def family_metadata(w, arch: str, cfg: dict) -> None:
    """What llama.cpp's converter writes for Gemma 2/3 and Phi-3 beyond the common keys."""
    import gguf

    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "gemma3" and cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3", "phi3"):
        w.add_sliding_window(cfg.get("sliding_window") or 0)
    if arch == "gemma3":
        scaling = cfg["rope_parameters"]["full_attention"]
        if scaling["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(scaling["factor"])
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: q/k rows reordered for its rotary layout."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Where a K-quant block keeps its fp16 super-block scales (ggml's block_q*_K): byte offset, count.
K_SCALES = {"Q2_K": (80, 2), "Q3_K": (108, 1), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1)}


def random_blocks(shape: tuple[int, ...], qtype) -> np.ndarray:
    """Random bytes in the layout of `qtype` (one gguf-py cannot write); for a K-quant with small
    fp16 super-block scales (d, and dmin where there is one), so the values are finite and model-sized."""
    import gguf

    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, gguf.quants.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
    if qtype.name not in K_SCALES:
        return data
    blocks = data.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    start, count = K_SCALES[qtype.name]
    magnitude = 2e-5 if qtype.name in ("Q6_K", "Q3_K") else 4e-4  # Q6_K/Q3_K: 8- and 6-bit signed sub-scales
    values = (magnitude * rng.uniform(0.5, 1.5, (len(blocks), count))).astype(np.float16)
    blocks[:, start : start + 2 * count] = values.view(np.uint8)
    return data


def rope_tensors(w, cfg: dict, head_dim: int) -> None:
    """The rotary scaling llama.cpp's converter stores as tensors: Llama 3.1's llama3 scaling as
    per-frequency factors (LlamaModel.generate_extra_tensors: the pretraining length read from the
    top level, default 8192), Phi-3's LongRoPE factors (Phi3MiniModel), with its attention factor."""
    import math

    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type") == "llama3":
        freqs = 1.0 / (np.float32(rope["rope_theta"]) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = cfg.get("original_max_position_embeddings", 8192)
        factors = []
        for freq in freqs:
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
    if rope.get("rope_type") == "longrope":
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
        scale = cfg["max_position_embeddings"] / cfg["original_max_position_embeddings"]
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(cfg["original_max_position_embeddings"])))


def write_vocab(w, arch: str, cfg: dict, vocab: str) -> None:
    """The tokenizer metadata: the byte-level BPE vocabulary ("gpt2") or one of SPM's."""
    if vocab in SPM:
        spm = SPM[vocab]
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(spm["tokens"])
        w.add_token_scores(spm["scores"])
        w.add_token_types(spm["types"])
        w.add_bos_token_id(spm["bos"])
        w.add_eos_token_id(spm["eos"])
        w.add_unk_token_id(spm["unk"])
        if spm["pad"] is not None:
            w.add_pad_token_id(spm["pad"])
        w.add_add_space_prefix(vocab != "gemma")
        w.add_chat_template("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}")
        return
    spelled = bytes_to_unicode()
    tokens = [spelled[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES] + ["<|endoftext|>", "<think>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 4])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(cfg.get("eos_token_id") or len(tokens) - 2)
    w.add_chat_template("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")


def write_gguf(source: Path, path: Path, types: dict[str, str] | str = "F32", name: str = "tiny",
               vocab: str = "gpt2") -> Path:
    """Writes `source` (a transformers checkpoint folder) as a GGUF file. `types`: the GGML type of
    every 2-D weight, or a {fnmatch pattern of the GGUF name: type} dict (first match; F32 otherwise).
    `vocab`: "gpt2" (byte-level BPE) or a key of SPM (the source's vocab_size must match it)."""
    import fnmatch

    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((source / "config.json").read_text())
    arch = ARCH[cfg["architectures"][0].replace("ForCausalLM", "Config")]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' theta
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    family_metadata(w, arch, cfg)
    write_vocab(w, arch, cfg, vocab)
    rope_tensors(w, cfg, head_dim)
    tensors = {}
    for f in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(f))
    for hf, value in tensors.items():
        value = value.astype(np.float32)
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            value = permute(value, heads if "q_proj" in hf else kv)
        if arch.startswith("gemma") and hf.endswith("norm.weight"):
            value = value + 1  # Gemma's RMSNorm scale 1 + weight, as llama.cpp's converter stores it
        name_ = gguf_name(hf, arch)
        kind = "F32"
        if value.ndim == 2:
            kind = types if isinstance(types, str) else next(
                (t for p, t in types.items() if fnmatch.fnmatchcase(name_, p)), "F32")
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            w.add_tensor(name_, value)
        elif kind == "F16":
            w.add_tensor(name_, value.astype(np.float16))
        else:
            try:
                data = gguf.quants.quantize(value, qtype)
            except NotImplementedError:  # a type gguf-py cannot write: random blocks (see random_blocks)
                data = random_blocks(value.shape, qtype)
            w.add_tensor(name_, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized_checkpoint(path: Path, source: Path, folder: Path) -> Path:
    """A transformers checkpoint of what a GGUF file holds: `source`'s config with every tensor
    dequantized by gguf-py and mapped back (names, Llama's q/k rows, Gemma's 1 + weight) — the
    reference for architectures transformers cannot load from GGUF (Gemma 1)."""
    import shutil

    import gguf
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((source / "config.json").read_text())
    arch = ARCH[cfg["architectures"][0].replace("ForCausalLM", "Config")]
    names = {}
    for f in sorted(source.glob("*.safetensors")):
        names.update({gguf_name(hf, arch): hf for hf in load_file(f)})
    tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name.startswith("rope_"):  # rotary scaling, in the config
            continue
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        hf = names.pop(t.name)
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in hf else cfg["num_key_value_heads"]
            value = value.reshape(heads, value.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(value.shape)
        if arch.startswith("gemma") and hf.endswith("norm.weight"):
            value = value - 1
        tensors[hf] = np.ascontiguousarray(value)
    assert not names, f"not in the GGUF: {sorted(names)}"
    folder.mkdir(parents=True)
    shutil.copy(source / "config.json", folder / "config.json")
    save_file(tensors, folder / "model.safetensors")
    return folder
