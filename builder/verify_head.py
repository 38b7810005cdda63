"""--verify for a package's draft head (mtp.onnx, builder/draft_head.py): its logits and hidden_states_out
against the head's math in transformers' own modules, and the draft acceptance of builder.speculative.

transformers drops a checkpoint's multi-token-prediction head on load, so the reference is written out
from the facts of its layout: x = projection(concat(norm_e(embed(t_{i+1})), norm_h(h_i))), the family's
decoder layer (transformers' class, loaded with the head's layer tensors), the final norm, lm_head —
transformers' own layer, RMSNorm and rotary classes, the decoder's embedding and lm_head (rounded as
the build rounds them where it quantizes: builder/verify.py). Imported by builder/verify.py only.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HeadReference", "head_layout", "text_model"]


def text_model(model) -> Any:
    """The decoder stack of a transformers model (`model.model`, or a multimodal one's language model)."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def head_layout(head, c: Any) -> dict[str, Any]:
    """Where the head's tensors are (a DraftHead of the family, `c` its parsed config): the module
    prefix, the layer's prefix and the index transformers builds that layer with (Qwen's mtp.layers.0
    is a one-layer config's layer 0; DeepSeek's and GLM's next-token layer is layer num_hidden_layers)."""
    prefix, layer = head.prefix(c), head.layer_prefix(c)
    return dict(prefix=prefix, layer=layer, layer_idx=c.num_hidden_layers if layer == prefix else None,
                embedding_norm=prefix + head.embedding_norm, hidden_norm=prefix + head.hidden_norm,
                projection=prefix + head.projection, final_norm=prefix + head.final_norm,
                copies=tuple(prefix + name for name, _ in head.copies))


class HeadReference:
    """The head's forward in torch: `__call__(hidden (S, H), tokens (S,), positions (S,))` ->
    (logits (S, V), the normed output (S, H)) over a whole sequence (causal attention among its
    rows). `model`: transformers' model of the checkpoint (its classes, embedding and lm_head);
    `tensors`: the head's tensors by name; `layout`: head_layout's."""

    def __init__(self, model, tensors: dict[str, Any], layout: dict[str, Any]):
        import torch

        text = text_model(model)
        config = copy.deepcopy(text.config)
        config._attn_implementation = "eager"
        if layout["layer_idx"] is None:  # one full-attention layer of its own config
            config.num_hidden_layers, config.layer_types = 1, ["full_attention"]
        layer_cls, norm_cls = type(text.layers[0]), type(text.norm)
        self.layer = layer_cls(config, layer_idx=layout["layer_idx"] or 0).eval()
        own = {layout[k] for k in ("embedding_norm", "hidden_norm", "final_norm")}
        own |= {layout["projection"], *layout["copies"]}
        state = {k[len(layout["layer"]):]: v for k, v in tensors.items() if k.startswith(layout["layer"]) and k not in own}
        missing, unexpected = self.layer.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"the head's layer does not load into {layer_cls.__name__}: missing {missing}, "
                             f"unexpected {unexpected}")
        H = config.hidden_size

        def norm(name: str):
            n = norm_cls(H, eps=config.rms_norm_eps)
            n.load_state_dict({"weight": tensors[layout[name]]})
            return n.eval()

        self.norm_e, self.norm_h, self.norm = norm("embedding_norm"), norm("hidden_norm"), norm("final_norm")
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.fc.weight.data = tensors[layout["projection"]].float()
        self.embed, self.head = model.get_input_embeddings(), model.get_output_embeddings()
        self.rotary = text.rotary_emb

    def modules(self):
        """The head's own modules (what a quantized build rounds: the projection, the layer)."""
        import torch

        return torch.nn.ModuleDict({"fc": self.fc, "layer": self.layer})

    def __call__(self, hidden: np.ndarray, tokens, positions) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            h = torch.from_numpy(np.asarray(hidden, np.float32))[None]
            e = self.embed(torch.as_tensor(np.asarray(tokens))[None])
            x = self.fc(torch.cat([self.norm_e(e), self.norm_h(h)], dim=-1))
            pos = torch.as_tensor(np.asarray(positions))[None]
            cos, sin = self.rotary(x, pos)
            S = x.shape[1]
            mask = torch.full((1, 1, S, S), float("-inf")).triu(1)
            y = self.layer(x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=pos)
            y = y[0] if isinstance(y, tuple) else y
            out = self.norm(y)
            return self.head(out)[0].numpy(), out[0].numpy()


def read_head_tensors(folder: Path, layout: dict[str, Any]) -> dict[str, Any]:
    """The head's tensors (under its prefix) from the checkpoint's safetensors files, as torch tensors."""
    from safetensors import safe_open

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            tensors |= {k: f.get_tensor(k).float() for k in f.keys() if k.startswith(layout["prefix"])}
    return tensors
