"""Qwen3-VL's vision encoder: one image's patches to its image features and DeepStack features.

Reference: transformers/models/qwen3_vl/modeling_qwen3_vl.py (Qwen3VLVisionModel and its modules)
and transformers/vision_utils.py (get_vision_interpolation_indices_and_weights). Apart from
Qwen2.5-VL's encoder (architectures/qwen2_5_vl_vision.py, whose patch positions, 2-D rotary and
attention it shares): the patch embedding has a bias; a learned square grid of position
embeddings, bilinearly interpolated (align_corners) to the image's grid, is added to the patches;
LayerNorm blocks with a tanh-GELU MLP (linear_fc1, linear_fc2); every block attends over the whole
frame (no windows); the merger normalizes before merging. The blocks of `deepstack_visual_indexes`
also feed their own mergers (normalized after merging): their features go to the decoder's first
layers. Output: (patches / merge², (1 + k) · out_hidden_size), [merged | ds 0 | … | ds k−1] (see
architectures/qwen3_vl.py for why they travel together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.qwen2_5_vl_vision import (TOWER_PREFIXES, AttentionGroups, Patches, VisionGeometry, attention, tower_model,
                                             frames, patches, vision_rotary)
from architectures.gemma3_vision import mlp_branch
from builder.architecture import Weights, prefix_holding
from builder.blocks import ResidualStream, activation, layer_norm, linear
from builder.config_checks import config_object
from builder.graph import Graph
from builder.hf_config import from_dict
from builder.inputs.source import Checkpoint
from builder.target import Target

__all__ = ["Qwen3VLVisionConfig", "build", "parse_config", "vision_model"]

NORM_EPS = 1e-6  # Qwen3VLVisionBlock's and the mergers' LayerNorms


@dataclass(frozen=True)
class Qwen3VLVisionConfig(VisionGeometry):
    """config.json's `vision_config` (Qwen3VLVisionConfig's keys and defaults)."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    patch_size: int = 16
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: list[int] = field(default_factory=lambda: [8, 16, 24])
    rope_parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_heads()
        if math.isqrt(self.num_position_embeddings) ** 2 != self.num_position_embeddings:
            raise ValueError(f"vision_config: num_position_embeddings {self.num_position_embeddings} is not a square "
                             "grid")
        self.check_blocks(self.deepstack_visual_indexes, "deepstack_visual_indexes")

    @property
    def grid_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def features_width(self) -> int:
        return (1 + len(self.deepstack_visual_indexes)) * self.out_hidden_size


def parse_config(raw: dict[str, Any]) -> Qwen3VLVisionConfig:
    return from_dict(Qwen3VLVisionConfig, config_object(raw, "vision_config"), key_prefix="vision_config.")


def position_embedding(g: Graph, p: Patches, table: ir.Value, side: int) -> ir.Value:
    """The learned (side², H) grid resampled to each patch's (row, col) of the image's grid:
    bilinear with align_corners (source = index · (side − 1) / (size − 1)), the four taps clamped to
    the grid, as get_vision_interpolation_indices_and_weights computes them in float32; (N, H)."""
    f32, i64 = ir.DataType.FLOAT, ir.DataType.INT64
    last = g.constant(float(side - 1), np.float32)
    one = g.constant(1.0, np.float32)
    axes = []
    for index, size in ((p.row, p.height), (p.col, p.width)):
        span = g.op.Cast(g.op.Max(g.op.Sub(size, g.constant(1, np.int64)), g.constant(1, np.int64)), to=f32)
        source = g.op.Div(g.op.Mul(g.op.Cast(index, to=f32), last), span)  # (N,)
        low = g.op.Floor(source)
        taps = [g.op.Clip(g.op.Add(g.op.Cast(low, to=i64), g.constant(k, np.int64)), g.constant(0, np.int64),
                          g.constant(side - 1, np.int64)) for k in (0, 1)]
        fraction = g.op.Sub(source, low)
        # 1 − |distance| of the taps at floor and floor + 1, at least 0.
        weights = [g.op.Max(g.op.Sub(one, g.op.Abs(g.op.Sub(fraction, g.constant(float(k), np.float32)))),
                            g.constant(0.0, np.float32)) for k in (0, 1)]
        axes.append((taps, weights))
    (row_taps, row_weights), (col_taps, col_weights) = axes
    total = None
    for r in (0, 1):
        for c in (0, 1):
            index = g.op.Add(g.op.Mul(row_taps[r], g.constant(side, np.int64)), col_taps[c])  # (N,)
            weight = g.op.Unsqueeze(g.op.Mul(row_weights[r], col_weights[c]), g.constant([1], np.int64))  # (N, 1)
            term = g.op.Mul(g.op.Gather(table, index, axis=0), weight)  # (N, H)
            total = term if total is None else g.op.Add(total, term)
    return total


def merger(g: Graph, x: ir.Value, w: Weights, c: Qwen3VLVisionConfig, target: Target, norm_after: bool) -> ir.Value:
    """Qwen3VLVisionPatchMerger: LayerNorm over each patch (or over each merged group, DeepStack's
    `use_postshuffle_norm`), merge² patches to a row, linear_fc1, GELU, linear_fc2."""
    H, wide = c.hidden_size, c.hidden_size * c.spatial_merge_size ** 2
    merged = g.constant([-1, wide], np.int64)
    with g.scope("norm"):
        if norm_after:
            x = layer_norm(g, g.op.Reshape(x, merged), w("norm.weight", wide), w("norm.bias", wide), NORM_EPS, target)
        else:
            x = g.op.Reshape(layer_norm(g, x, w("norm.weight", H), w("norm.bias", H), NORM_EPS, target), merged)
    with g.scope("linear_fc1"):  # (N / m², m²·H)
        x = linear(g, x, w("linear_fc1.weight", wide, wide), target, w("linear_fc1.bias", wide))
    with g.scope("act_fn"):
        x = activation(g, x, "gelu", target)  # nn.GELU(): the exact erf form
    with g.scope("linear_fc2"):
        return linear(g, x, w("linear_fc2.weight", c.out_hidden_size, wide), target,
                      w("linear_fc2.bias", c.out_hidden_size))  # (N / m², out_hidden_size)


def block(g: Graph, stream: ResidualStream, w: Weights, c: Qwen3VLVisionConfig, rotary, groups: AttentionGroups,
          target: Target) -> None:
    """Qwen3VLVisionBlock.forward: x + attn(norm1(x)), then x + mlp(norm2(x)), LayerNorms."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("norm1"):
        h = stream.norm(w("norm1.weight", H), w("norm1.bias", H))
    with g.scope("attn"):
        stream.add(attention(g, h, w.under("attn."), H, c.num_heads, rotary, groups, target))
    mlp_branch(g, stream, w, "norm2", ("linear_fc1", "linear_fc2"), H, I, c.hidden_act, target)


def build(g: Graph, pixels: ir.Value, grid: ir.Value, ckpt: Checkpoint, c: Qwen3VLVisionConfig,
          target: Target) -> ir.Value:
    """Records the encoder on `g`: pixel_values (N, C·T·P·P) and image_grid_thw (1, 3) ->
    (N / merge², (1 + k) · out_hidden_size), in the target's IO dtype."""
    H = c.hidden_size
    tower = Weights(ckpt, prefix_holding(ckpt, "patch_embed.proj.weight", TOWER_PREFIXES))
    with g.scope("model", "visual", "patch_layout"):
        p = patches(g, pixels, grid, c.spatial_merge_size)
        rotary = vision_rotary(g, p, c.head_dim, c.rope_theta, target)
        groups = frames(g, p)  # every block: the whole frame
    with g.scope("model", "visual", "patch_embed", "proj"):
        T, P = c.temporal_patch_size, c.patch_size
        kernel = tower("patch_embed.proj.weight", H, c.in_channels, T, P, P).reshaped(H, c.patch_values)
        x = linear(g, pixels, kernel, target, tower("patch_embed.proj.bias", H))  # (N, C·T·P·P) -> (N, H)
    with g.scope("model", "visual", "pos_embed"):
        table = g.weight("weight", tower("pos_embed.weight", c.num_position_embeddings, H).astype(np.float32))
        positions = position_embedding(g, p, table, c.grid_side)  # (N, H) float32
        x = g.op.Add(x, g.op.Cast(positions, to=ir.DataType.from_numpy(np.dtype(target.io_dtype))))
    x = g.op.Unsqueeze(x, g.constant([0], np.int64))  # -> (1, N, H)
    residual = np.float32 if target.io_dtype == np.float16 else None
    stream = ResidualStream(g, x, NORM_EPS, target, residual, layer_norm=True)
    deepstack = []
    for i in range(c.depth):
        with g.scope("model", "visual", f"blocks.{i}"):
            block(g, stream, tower.under(f"blocks.{i}."), c, rotary, groups, target)
        if i in c.deepstack_visual_indexes:
            j = c.deepstack_visual_indexes.index(i)
            with g.scope("model", "visual", f"deepstack_merger_list.{j}"):
                deepstack.append((j, merger(g, stream.value(), tower.under(f"deepstack_merger_list.{j}."), c, target,
                                            norm_after=True)))
    with g.scope("model", "visual", "merger"):
        merged = merger(g, stream.value(), tower.under("merger."), c, target, norm_after=False)
    return g.op.Concat(merged, *(f for _, f in sorted(deepstack)), axis=-1)  # (N / m², (1 + k)·out_hidden_size)


def vision_model(ckpt: Checkpoint, c: Qwen3VLVisionConfig, target: Target, g: Graph | None = None) -> ir.Model:
    """The whole vision model: inputs `pixel_values` (patches, C·T·P·P) and `image_grid_thw` (1, 3)
    int64; output `image_features` (tokens, (1 + k) · out_hidden_size)."""
    return tower_model(build, c.features_width, ckpt, c, target, g)
