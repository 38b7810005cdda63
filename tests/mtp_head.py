"""Tiny checkpoints with a multi-token-prediction head in the hub's names, and the head's math.

transformers drops `mtp.*` on load and on save (Qwen3_5ForCausalLM's _keys_to_ignore_on_load_unexpected),
so a saved tiny model has no head: `add_mtp_head` writes one into the checkpoint's safetensors as the
hub's Qwen3.5 / Qwen3-Next checkpoints store it (the names onnxruntime-genai's builder reads in
loaders/qwen.py and vLLM's Qwen3-Next MTP reads): mtp.fc.weight [hidden, 2·hidden],
mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [hidden], and
mtp.layers.0.* a full-attention decoder layer of the family's class in its own parameter names.

`head_reference` is the head written out from those facts (builder/verify_head.py, as onnxruntime-genai's
export reproduces it, examples/python/qwen-3.6-mtp.md): fc(concat(norm_e(embed(t)), norm_h(h))) -> the
layer -> norm -> lm_head, run with transformers' own decoder layer, rotary and norms.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file


def _text_config(folder: Path):
    config = transformers.AutoConfig.from_pretrained(folder)
    return getattr(config, "text_config", None) or config


def _layer_class(config):
    """The family's decoder layer class and its RMSNorm (transformers' modeling module)."""
    module = __import__(type(config).__module__.replace("configuration_", "modeling_"), fromlist=["_"])
    layer = next(getattr(module, n) for n in dir(module) if n.endswith("DecoderLayer") and not n.startswith("_"))
    norm = next(getattr(module, n) for n in dir(module) if n.endswith("RMSNorm") and "Gated" not in n)
    rotary = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding") and "Vision" not in n)
    return layer, norm, rotary


def head_config(config):
    c = copy.deepcopy(config)
    c.num_hidden_layers = 1
    c.layer_types = ["full_attention"]
    return c


def add_mtp_head(folder: Path, seed: int = 1, drop: str | None = None, shapes: dict | None = None) -> Path:
    """Writes a random MTP head into `folder`'s model.safetensors under the hub's names (all of
    them, but `drop`; `shapes` overrides a tensor's shape, for the bad-input tests) and sets
    config.json's mtp_num_hidden_layers to 1, as the hub's configs do."""
    config = _text_config(folder)
    layer_cls, _, _ = _layer_class(config)
    torch.manual_seed(seed)
    layer = layer_cls(head_config(config), layer_idx=0)
    H = config.hidden_size
    tensors = {f"mtp.layers.0.{k}": v.detach().clone() for k, v in layer.state_dict().items()}
    for name in tensors:  # random norm weights: a norm read without its (1 + w) offset would show
        if "norm" in name:
            tensors[name] = 0.2 * torch.randn_like(tensors[name])
        elif name.endswith("mlp.gate.weight"):  # a decisive router: its top k far from ties
            tensors[name] = 2.0 * torch.randn_like(tensors[name])
        else:
            tensors[name] = 0.1 * torch.randn_like(tensors[name])
    tensors |= {"mtp.fc.weight": 0.1 * torch.randn(H, 2 * H)}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{n}.weight"] = 0.2 * torch.randn(H)
    for name, shape in (shapes or {}).items():
        tensors[name] = torch.randn(*shape)
    tensors.pop(drop, None)
    path = folder / "model.safetensors"
    stored = load_file(path)
    save_file({**stored, **{k: v.contiguous() for k, v in tensors.items()}}, path, metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    (raw.get("text_config") or raw)["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    return folder


def add_nextn_head(folder: Path, seed: int = 1) -> Path:
    """Writes DeepSeek-V3's / GLM-4.5's next-token-prediction module into `folder` as their hub
    checkpoints store it (DeepSeek-V3's README_WEIGHTS.md; llama.cpp's converter maps the same names):
    model.layers.{num_hidden_layers}.{enorm, hnorm, eh_proj [hidden, 2·hidden], shared_head.norm}, a
    decoder layer of the family's class in its own names, and copies of the decoder's embedding
    (embed_tokens) and lm_head (shared_head.head); config.json's num_nextn_predict_layers 1."""
    config = _text_config(folder)
    layer_cls, _, _ = _layer_class(config)
    N, H = config.num_hidden_layers, config.hidden_size
    torch.manual_seed(seed)
    layer = layer_cls(config, layer_idx=N)
    prefix = f"model.layers.{N}."
    tensors = {}
    for name, value in layer.state_dict().items():
        if "norm" in name:
            value = 1.0 + 0.2 * torch.randn_like(value)
        elif name.endswith("e_score_correction_bias"):  # a sigmoid router decided by its bias: no near-ties
            value = torch.randn_like(value)
        else:
            value = 0.1 * torch.randn_like(value) if value.is_floating_point() else value
        tensors[prefix + name] = value.detach().clone()
    tensors[prefix + "eh_proj.weight"] = 0.1 * torch.randn(H, 2 * H)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{prefix}{n}.weight"] = 1.0 + 0.2 * torch.randn(H)
    path = folder / "model.safetensors"
    stored = load_file(path)
    tensors[prefix + "embed_tokens.weight"] = stored["model.embed_tokens.weight"].clone()
    tensors[prefix + "shared_head.head.weight"] = stored["lm_head.weight"].clone()
    save_file({**stored, **{k: v.contiguous() for k, v in tensors.items()}}, path, metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    return folder


def head_reference(folder: Path, model=None):
    """The head's math in transformers' modules (builder.verify_head.HeadReference, what --verify
    compares with) for the checkpoint in `folder`, its family's head layout read from config.json."""
    import architectures
    from builder.verify_head import HeadReference, head_layout, read_head_tensors

    raw = json.loads((folder / "config.json").read_text())
    name = raw["architectures"][0]
    family = architectures.load(name)
    layout = head_layout(family.mtp, family.parse_config(raw, name))
    if model is None:
        auto = transformers.AutoModelForImageTextToText if "ConditionalGeneration" in name else \
            transformers.AutoModelForCausalLM
        model = auto.from_pretrained(folder, dtype=torch.float32).eval()
    return HeadReference(model, read_head_tensors(folder, layout), layout)
