"""Tiny checkpoints with a multi-token-prediction head in the hub's names, and the head's math.

transformers drops `mtp.*` on load and on save (Qwen3_5ForCausalLM's _keys_to_ignore_on_load_unexpected),
so a saved tiny model has no head: `add_mtp_head` writes one into the checkpoint's safetensors as the
hub's Qwen3.5 / Qwen3-Next checkpoints store it (the names onnxruntime-genai's builder reads in
loaders/qwen.py and vLLM's Qwen3-Next MTP reads): mtp.fc.weight [hidden, 2·hidden],
mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [hidden], and
mtp.layers.0.* a full-attention decoder layer of the family's class in its own parameter names.

`head_forward` is the head written out from those facts (as onnxruntime-genai's export reproduces it,
examples/python/qwen-3.6-mtp.md): fc(concat(norm_e(embed(t)), norm_h(h))) -> the layer -> norm ->
lm_head, run with transformers' own decoder layer, rotary and norms.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
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


class HeadReference:
    """The head's forward in torch from the checkpoint's tensors, with transformers' layer, norms
    and rotary: `__call__(hidden (S, H), tokens (S,), positions (S,))` -> (logits, normed output),
    over a whole sequence at once (causal attention among its rows)."""

    def __init__(self, folder: Path):
        config = _text_config(folder)
        layer_cls, norm_cls, rotary_cls = _layer_class(config)
        c = head_config(config)
        c._attn_implementation = "eager"
        tensors = load_file(folder / "model.safetensors")
        self.layer = layer_cls(c, layer_idx=0).eval()
        state = {k[len("mtp.layers.0."):]: v for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
        missing, unexpected = self.layer.load_state_dict(state, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        H, eps = c.hidden_size, c.rms_norm_eps

        def norm(name):
            n = norm_cls(H, eps=eps)
            n.load_state_dict({"weight": tensors[f"mtp.{name}.weight"]})
            return n.eval()

        self.norm_e, self.norm_h, self.norm = norm("pre_fc_norm_embedding"), norm("pre_fc_norm_hidden"), norm("norm")
        self.fc = tensors["mtp.fc.weight"]
        embed = next(v for k, v in tensors.items() if k.endswith("embed_tokens.weight"))
        self.embed = embed
        self.head = tensors.get("lm_head.weight", embed)
        self.rotary = rotary_cls(config=c)

    @torch.no_grad()
    def __call__(self, hidden: np.ndarray, tokens, positions) -> tuple[np.ndarray, np.ndarray]:
        h = torch.from_numpy(np.asarray(hidden, np.float32))[None]
        ids = torch.as_tensor(tokens)[None]
        e = self.embed[ids]
        x = torch.cat([self.norm_e(e), self.norm_h(h)], dim=-1) @ self.fc.T
        pos = torch.as_tensor(positions)[None]
        cos, sin = self.rotary(x, pos)
        S = x.shape[1]
        mask = torch.full((1, 1, S, S), float("-inf")).triu(1)
        y = self.layer(x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        out = self.norm(y)
        return (out @ self.head.T)[0].numpy(), out[0].numpy()
