"""Gemma 3's image encoder: the SigLIP vision tower and Gemma3MultiModalProjector, as one model
from `pixel_values` to the `image_features` that replace the image tokens' embeddings.

Reference: transformers/models/siglip/modeling_siglip.py (SiglipVisionEmbeddings,
SiglipEncoderLayer, SiglipVisionModel) and gemma3/modeling_gemma3.py (Gemma3MultiModalProjector,
Gemma3Model.get_image_features). Patches by a strided Conv plus learned position embeddings
(no interpolation: images come at `image_size`), pre-LayerNorm encoder layers with biased
projections, attention over all patches in both directions, tanh-GELU MLP, post_layernorm; then
average pooling to `mm_tokens_per_image`, Gemma's (1 + weight) RMSNorm (folded) and a projection
to the text decoder's width.

    >>> c = parse_config(json.load(open("gemma-3-4b-it/config.json")))   # doctest: +SKIP
    >>> save_model(vision_model(Checkpoint.open("gemma-3-4b-it"), c, target), folder)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.gemma import GemmaWeights
from builder.architecture import Weights
from builder.blocks import ResidualStream, linear, plain_mlp, rms_norm
from builder.config_checks import config_object, config_value
from builder.errors import BuildError
from builder.graph import Graph
from builder.io import tensor_type
from builder.hf_config import from_dict
from builder.inputs.source import Checkpoint
from builder.target import Target

__all__ = ["IGNORED", "Gemma3VisionConfig", "build", "parse_config", "vision_model"]

# Where the tower lives: the hub's -it checkpoints (transformers 4's SiglipVisionModel kept an inner
# vision_model), what transformers 5 saves, and transformers 5's own module paths.
TOWER_PREFIXES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                  "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
# SigLIP's attention-pooling head (vision_use_head): get_image_features replaces its output by the
# projector's, so transformers computes it for nothing; the hub's Gemma 3 checkpoints have none.
IGNORED = tuple(f"{p}head.*" for p in TOWER_PREFIXES)


@dataclass(frozen=True)
class Gemma3VisionConfig:
    """config.json's `vision_config` (SiglipVisionConfig's keys and defaults), the outer
    `mm_tokens_per_image`, and `text_hidden_size`: `text_config.hidden_size`, the projection's width."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    vision_use_head: bool = True
    mm_tokens_per_image: int = 256
    text_hidden_size: int = 2304  # Gemma3TextConfig's default

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, int) or not isinstance(self.patch_size, int):
            raise TypeError("vision_config: image_size and patch_size must be integers (Gemma 3's projector needs it)")
        side = math.isqrt(self.mm_tokens_per_image)
        if side * side != self.mm_tokens_per_image or self.patches_per_side % side:
            raise ValueError(f"mm_tokens_per_image {self.mm_tokens_per_image} is not a square that pools "
                             f"{self.patches_per_side}x{self.patches_per_side} patches evenly")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"vision_config: hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens_per_image)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def parse_config(raw: dict[str, Any]) -> Gemma3VisionConfig:
    """The encoder's settings from a Gemma3ForConditionalGeneration config.json; missing keys take
    transformers' defaults (Gemma3Config makes a default SiglipVisionConfig when vision_config is absent)."""
    tokens = config_value("mm_tokens_per_image", raw.get("mm_tokens_per_image", 256), int)  # the outer config's
    text_hidden = config_object(raw, "text_config").get("hidden_size", Gemma3VisionConfig.text_hidden_size)
    return from_dict(Gemma3VisionConfig, config_object(raw, "vision_config"), key_prefix="vision_config.",
                     mm_tokens_per_image=tokens, text_hidden_size=text_hidden)


def _prefix(ckpt: Checkpoint, prefixes: tuple[str, ...], probe: str) -> str:
    for prefix in prefixes:
        if prefix + probe in ckpt:
            return prefix
    raise BuildError(f"the checkpoint has no {probe} under any of {', '.join(prefixes)}: no vision encoder to build")


def mlp_branch(g: Graph, stream: ResidualStream, w: Weights, norm: str, names: tuple[str, str], H: int, I: int,
               act: str, target: Target) -> None:
    """A vision encoder layer's second half (SigLIP's, Qwen3-VL's): `norm` (a LayerNorm with bias),
    then `mlp`'s up and down projections `names` (with biases) around `act`, added to the stream."""
    with g.scope(norm):
        h = stream.norm(w(f"{norm}.weight", H), w(f"{norm}.bias", H))
    m, (up, down) = w.under("mlp."), names
    with g.scope("mlp"):
        stream.add(plain_mlp(g, h, m(f"{up}.weight", I, H), m(f"{down}.weight", H, I), act, target,
                             (m(f"{up}.bias", I), m(f"{down}.bias", H)), names=names))


def encoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: Gemma3VisionConfig, target: Target) -> None:
    """SiglipEncoderLayer.forward: x + attn(layer_norm1(x)), then + mlp(layer_norm2(x))."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("layer_norm1"):
        h = stream.norm(w("layer_norm1.weight", H), w("layer_norm1.bias", H))
    a = w.under("self_attn.")
    with g.scope("self_attn"):
        q, k, v = (_projection(g, h, a, name, H, H, target) for name in ("q_proj", "k_proj", "v_proj"))
        # Every patch attends to every patch (SiglipAttention.is_causal is False): no mask.
        h = g.ms.MultiHeadAttention(q, k, v, num_heads=c.num_attention_heads, scale=c.head_dim ** -0.5)
        stream.add(_projection(g, h, a, "out_proj", H, H, target))
    mlp_branch(g, stream, w, "layer_norm2", ("fc1", "fc2"), H, I, c.hidden_act, target)


def _projection(g: Graph, x: ir.Value, w: Weights, name: str, out: int, inp: int, target: Target) -> ir.Value:
    with g.scope(name):
        return linear(g, x, w(f"{name}.weight", out, inp), target, w(f"{name}.bias", out))


def build(g: Graph, pixel_values: ir.Value, ckpt: Checkpoint, c: Gemma3VisionConfig, target: Target) -> ir.Value:
    """Records the encoder and projector on `g`: pixel_values (N, C, S, S) -> image_features
    (N, mm_tokens_per_image, text_hidden_size), in the target's IO dtype."""
    H, P, p = c.hidden_size, c.patch_size, c.patches_per_side
    tower = Weights(ckpt, _prefix(ckpt, TOWER_PREFIXES, "embeddings.patch_embedding.weight"))
    with g.scope("model", "vision_tower", "embeddings"):
        e = tower.under("embeddings.")
        with g.scope("patch_embedding"):
            conv_w = g.weight("weight", e("patch_embedding.weight", H, c.num_channels, P, P).astype(target.io_dtype))
            conv_b = g.weight("bias", e("patch_embedding.bias", H).astype(target.io_dtype))
            x = g.op.Conv(pixel_values, conv_w, conv_b, kernel_shape=[P, P], strides=[P, P])  # (N, H, p, p)
        x = g.op.Transpose(g.op.Reshape(x, g.constant([0, H, p * p], np.int64)), perm=[0, 2, 1])  # -> (N, p·p, H)
        with g.scope("position_embedding"):
            positions = g.weight("weight", e("position_embedding.weight", p * p, H).astype(target.io_dtype))
        x = g.op.Add(x, positions)
    # As in the decoder, fp16 builds keep the residual stream and its norms in float32.
    residual = np.float32 if target.io_dtype == np.float16 else None
    stream = ResidualStream(g, x, c.layer_norm_eps, target, residual, layer_norm=True)
    for i in range(c.num_hidden_layers):
        with g.scope("model", "vision_tower", "encoder", f"layers.{i}"):
            encoder_layer(g, stream, tower.under(f"encoder.layers.{i}."), c, target)
    with g.scope("model", "vision_tower", "post_layernorm"):
        x = stream.norm(tower("post_layernorm.weight", H), tower("post_layernorm.bias", H))  # (N, p·p, H)
    projector = GemmaWeights(ckpt, _prefix(ckpt, PROJECTOR_PREFIXES, "mm_input_projection_weight"))
    t, k = c.tokens_per_side, p // c.tokens_per_side
    with g.scope("model", "multi_modal_projector"):
        x = g.op.Reshape(g.op.Transpose(x, perm=[0, 2, 1]), g.constant([0, H, p, p], np.int64))  # -> (N, H, p, p)
        with g.scope("avg_pool"):
            x = g.op.AveragePool(x, kernel_shape=[k, k], strides=[k, k])  # (N, H, t, t)
        x = g.op.Transpose(g.op.Reshape(x, g.constant([0, H, t * t], np.int64)), perm=[0, 2, 1])  # -> (N, t·t, H)
        with g.scope("mm_soft_emb_norm"):
            x = rms_norm(g, x, projector.norm("mm_soft_emb_norm.weight", H), c.layer_norm_eps, target)
        # mm_input_projection_weight is stored [in, out] already: x · W, no transpose.
        w = projector("mm_input_projection_weight", H, c.text_hidden_size).astype(target.io_dtype)
        return g.op.MatMul(x, g.weight("mm_input_projection_weight", w))  # (N, t·t, T)


def vision_model(ckpt: Checkpoint, c: Gemma3VisionConfig, target: Target, g: Graph | None = None) -> ir.Model:
    """The whole vision model: input `pixel_values` (num_images, C, S, S), output `image_features`
    (num_images, mm_tokens_per_image, text_hidden_size), both in the target's IO dtype; recorded on
    `g` (a new Graph by default). Three dimensions make onnxruntime-genai size the features for
    every image (it allocates num_images x 256 rows for a 3-D output, 256 in all for a 2-D one)."""
    g = g or Graph()
    dtype = tensor_type(target.io_dtype)
    pixels = ir.Value(name="pixel_values", type=dtype,
                      shape=ir.Shape(("num_images", c.num_channels, c.image_size, c.image_size)))
    features = build(g, pixels, ckpt, c, target)
    features.name = "image_features"
    features.type = dtype
    features.shape = ir.Shape(("num_images", c.mm_tokens_per_image, c.text_hidden_size))
    return g.model([pixels], [features])
