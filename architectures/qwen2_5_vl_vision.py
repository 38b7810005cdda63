"""Qwen2.5-VL's vision encoder: one image's patches (as onnxruntime-genai's processor sends them)
to the image features that replace its image-pad tokens' embeddings.

Reference: transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py
(Qwen2_5_VisionTransformerPretrainedModel and its modules) and transformers/vision_utils.py
(get_vision_position_ids, get_vision_window_index). The patch embedding is a Conv3d whose kernel
equals its stride, so over the processor's flattened patches (C·T·P·P values each, in merge
order) it is a linear. Blocks: RMSNorm, attention with a 2-D rotary (each patch's row and column),
SwiGLU MLP with biases; the blocks of `fullatt_block_indexes` attend over the whole image (each
frame), the others within windows of `window_size` pixels. The patch merger (ln_q, then an MLP
over each merge x merge group of patches) makes one token per group.

transformers reorders the patches window by window (get_window_index) so that each window is a
contiguous run, and puts the merged tokens back at the end. Attention within a set of patches
does not depend on their order, and everything else is per patch (or per merge group, which the
reordering keeps together), so here the patches stay in the processor's order and only attention
sees them grouped (AttentionGroups): a frame's patches are a contiguous run, so the full blocks
attend over (frames, h·w) with no mask; the window blocks gather each window's patches into a
slot of window² patches, edge windows padded with masked keys, and scatter the result back. A
window block so costs (windows · window²) · window² instead of N² (about N · window² once an image
spans several windows; padding makes it more than that on an image smaller than one window), and
no block holds an (N, N) mask or score matrix: ONNX Runtime's CPU attention materializes every
score when given a bias, and tiles them without one.

The graph is dynamic in the grid: pixel_values (patches, C·T·P·P) and image_grid_thw (1, 3)
int64, one image per call (onnxruntime-genai calls it once per image when the grid's first
dimension is fixed), returning (patches / merge², out_hidden_size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from builder.architecture import Weights, prefix_holding
from builder.blocks import ResidualStream, activation, gated_mlp, linear
from builder.blocks.rope import MultimodalRotary, default_inv_freq
from builder.config_checks import config_object
from builder.graph import Graph
from builder.io import tensor_type
from builder.hf_config import from_dict
from builder.inputs.source import Checkpoint
from builder.target import Target

__all__ = ["TOWER_PREFIXES", "AttentionGroups", "Patches", "Qwen2_5_VLVisionConfig", "VisionGeometry", "attention", "build",
           "frames", "parse_config", "patches", "vision_model", "vision_rotary"]

# The hub's layout, then transformers 5's module path.
TOWER_PREFIXES = ("visual.", "model.visual.")
NORM_EPS = 1e-6  # Qwen2_5_VLVisionBlock's and the merger's RMSNorm


@dataclass(frozen=True)
class VisionGeometry:
    """What both Qwen-VL encoders' vision_config share (Qwen3-VL's reuses it): the keys whose
    defaults both config classes give alike, and what they derive from them: the head size, one
    flattened patch, the rotary base, and the checks they share."""

    num_heads: int = 16
    in_channels: int = 3
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2

    def check_heads(self) -> None:
        """Heads that the 2-D rotary can split in four."""
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ValueError(f"vision_config: hidden_size {self.hidden_size} over num_heads {self.num_heads} is not "
                             "a head size divisible by 4 (the 2-D rotary splits it into four)")

    def check_blocks(self, blocks: list[int], key: str) -> None:
        """`blocks` (the config list `key`) within the depth."""
        if any(not 0 <= i < self.depth for i in blocks):
            raise ValueError(f"vision_config: {key} {blocks} name blocks outside 0..{self.depth - 1}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_values(self) -> int:
        """One flattened patch: C·T·P·P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters.get("rope_theta", 10_000.0))


@dataclass(frozen=True)
class Qwen2_5_VLVisionConfig(VisionGeometry):
    """config.json's `vision_config` (Qwen2_5_VLVisionConfig's keys and defaults; the hub's older
    `in_chans` read as in_channels)."""

    depth: int = 32
    hidden_size: int = 3584
    hidden_act: str = "silu"
    intermediate_size: int = 3420
    patch_size: int = 14
    tokens_per_second: int = 4
    window_size: int = 112
    out_hidden_size: int = 3584
    fullatt_block_indexes: list[int] = field(default_factory=lambda: [7, 15, 23, 31])
    rope_parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_heads()
        if self.window_size < self.spatial_merge_size * self.patch_size:
            raise ValueError(f"vision_config: window_size {self.window_size} is smaller than one merged patch "
                             f"({self.spatial_merge_size} x {self.patch_size} pixels)")
        self.check_blocks(self.fullatt_block_indexes, "fullatt_block_indexes")

    @property
    def window_units(self) -> int:
        """A window's side in merged patches (get_vision_window_index's vit_merger_window_size)."""
        return self.window_size // self.spatial_merge_size // self.patch_size


def parse_config(raw: dict[str, Any]) -> Qwen2_5_VLVisionConfig:
    """The encoder's settings from config.json's `vision_config` (transformers' defaults where it
    has none)."""
    vision = dict(config_object(raw, "vision_config"))
    if "in_chans" in vision:
        vision.setdefault("in_channels", vision["in_chans"])
    return from_dict(Qwen2_5_VLVisionConfig, vision, key_prefix="vision_config.")


@dataclass(frozen=True)
class Patches:
    """Each patch's place in its image, from the grid (int64, (N,) each): get_vision_position_ids'
    layout, merge x merge groups in raster order and raster order within a group."""

    index: ir.Value  # 0 … N − 1
    frame: ir.Value  # its temporal patch
    row: ir.Value
    col: ir.Value
    group_row: ir.Value  # its merge group's row and column
    group_col: ir.Value
    height: ir.Value  # the grid's h and w (scalars)
    width: ir.Value


def patches(g: Graph, pixels: ir.Value, grid: ir.Value, merge: int) -> Patches:
    """Where each of the N patches of `pixels` (N, C·T·P·P) lies in the image of `grid` (1, 3)."""
    i64 = lambda v: g.constant(v, np.int64)  # noqa: E731
    t_h_w = g.op.Reshape(grid, i64([3]))  # (1, 3) -> (3,)
    h, w = g.op.Gather(t_h_w, i64(1), axis=0), g.op.Gather(t_h_w, i64(2), axis=0)  # scalars
    count = g.op.Squeeze(g.op.Shape(pixels, start=0, end=1), i64([0]))  # N
    index = g.op.Range(i64(0), count, i64(1))  # (N,)
    frame_size = g.op.Mul(h, w)
    frame, place = g.op.Div(index, frame_size), g.op.Mod(index, frame_size)
    group, within = g.op.Div(place, i64(merge * merge)), g.op.Mod(place, i64(merge * merge))
    groups_wide = g.op.Div(w, i64(merge))
    group_row, group_col = g.op.Div(group, groups_wide), g.op.Mod(group, groups_wide)
    row = g.op.Add(g.op.Mul(group_row, i64(merge)), g.op.Div(within, i64(merge)))
    col = g.op.Add(g.op.Mul(group_col, i64(merge)), g.op.Mod(within, i64(merge)))
    return Patches(index, frame, row, col, group_row, group_col, h, w)


@dataclass(frozen=True)
class AttentionGroups:
    """Which patches attend to which, as MultiHeadAttention's batch: `gather` lays a (1, N, E)
    tensor out as (groups, group length, E), `scatter` puts the attention's output back in patch
    order. Frames are contiguous runs of one length, a reshape; windows are gathered into slots
    (`slots`: each patch's, `rows`: each slot's patch or N for a padded one, whose key `bias` masks)."""

    length: ir.Value  # (1,) int64: a group's length
    slots: ir.Value | None = None  # (N,) int64
    rows: ir.Value | None = None  # (groups · length,) int64
    bias: ir.Value | None = None  # (groups, 1, length, length): 0 for a patch's key, the dtype's lowest for padding

    def gather(self, g: Graph, x: ir.Value, width: int) -> ir.Value:
        shape = g.op.Concat(g.constant([-1], np.int64), self.length, g.constant([width], np.int64), axis=0)
        if self.rows is None:
            return g.op.Reshape(x, shape)  # (1, N, E) -> (frames, h·w, E)
        flat = g.op.Squeeze(x, g.constant([0], np.int64))  # (N, E)
        padded = g.op.Pad(flat, g.constant([0, 0, 1, 0], np.int64))  # row N: zeros for the empty slots
        return g.op.Reshape(g.op.Gather(padded, self.rows, axis=0), shape)  # (windows, window², E)

    def scatter(self, g: Graph, x: ir.Value) -> ir.Value:
        if self.rows is None:
            return g.op.Reshape(x, g.constant([1, -1, 0], np.int64))  # (frames, h·w, E) -> (1, N, E)
        flat = g.op.Flatten(x, axis=2)  # (windows · window², E)
        return g.op.Unsqueeze(g.op.Gather(flat, self.slots, axis=0), g.constant([0], np.int64))


def frames(g: Graph, p: Patches) -> AttentionGroups:
    """Each frame's patches attend to each other (Qwen-VL's full-attention blocks)."""
    return AttentionGroups(g.op.Reshape(g.op.Mul(p.height, p.width), g.constant([1], np.int64)))


def windows(g: Graph, p: Patches, side: int, target: Target) -> AttentionGroups:
    """The patches of each `side` x `side` window of a frame attend to each other, windows from the
    frame's top left (get_vision_window_index's). A window's slots are its row-major places, so an
    edge window's missing rows and columns are padded slots."""
    i64 = lambda v: g.constant(v, np.int64)  # noqa: E731
    dtype = np.dtype(target.io_dtype)
    length = side * side
    across, down = (g.op.Div(g.op.Add(n, i64(side - 1)), i64(side)) for n in (p.width, p.height))  # windows a frame
    window = g.op.Add(g.op.Mul(g.op.Add(g.op.Mul(p.frame, down), g.op.Div(p.row, i64(side))), across),
                      g.op.Div(p.col, i64(side)))
    place = g.op.Add(g.op.Mul(g.op.Mod(p.row, i64(side)), i64(side)), g.op.Mod(p.col, i64(side)))
    slots = g.op.Add(g.op.Mul(window, i64(length)), place)  # (N,)
    count = g.op.Shape(p.index)  # (1,): N
    n = g.op.Squeeze(count, i64([0]))  # N, the padded slots' row
    frame_count = g.op.Div(count, g.op.Reshape(g.op.Mul(p.height, p.width), i64([1])))
    total = g.op.Mul(g.op.Mul(g.op.Mul(frame_count, g.op.Unsqueeze(down, i64([0]))), g.op.Unsqueeze(across, i64([0]))),
                     i64([length]))  # (1,): windows · window²
    rows = g.op.ScatterElements(g.op.Expand(n, total), slots, p.index, axis=0)
    real = g.op.Reshape(g.op.Less(rows, n), i64([-1, 1, 1, length]))
    bias = g.op.Where(real, g.constant(0.0, dtype), g.constant(np.finfo(dtype).min, dtype))  # (windows, 1, 1, window²)
    bias = g.op.Expand(bias, i64([1, 1, length, 1]))  # every query row alike
    return AttentionGroups(i64([length]), slots, rows, bias)


@dataclass(frozen=True)
class PatchLayout:
    """Per patch, from the grid: its rotary tables and the attention groups of the two block kinds."""

    rotary: MultimodalRotary
    full: AttentionGroups  # each frame
    window: AttentionGroups  # each window of a frame


def patch_layout(g: Graph, pixels: ir.Value, grid: ir.Value, c: Qwen2_5_VLVisionConfig, target: Target) -> PatchLayout:
    """The rotary tables, and which patches attend to which: the whole frame (full blocks) or the
    patches of the same window (get_vision_window_index's windows of window_units merge groups)."""
    with g.scope("model", "visual", "patch_layout"):
        p = patches(g, pixels, grid, c.spatial_merge_size)
        rotary = vision_rotary(g, p, c.head_dim, c.rope_theta, target)
        return PatchLayout(rotary, frames(g, p), windows(g, p, c.window_units * c.spatial_merge_size, target))


def vision_rotary(g: Graph, p: Patches, head_dim: int, theta: float, target: Target) -> MultimodalRotary:
    """Qwen2_5_VLVisionRotaryEmbedding (and Qwen3-VL's): head_dim / 4 frequencies
    (theta^(-2i / (head_dim / 2))), the row's angles then the column's as the head's rotate_half
    pairs; per-patch (N, head_dim / 2) tables read at each patch's own index."""
    inv_freq = g.constant(default_inv_freq(theta, head_dim // 2))  # (head_dim / 4,)
    dtype = ir.DataType.from_numpy(np.dtype(target.io_dtype))
    with g.scope("rotary_pos_emb"):
        angles = [g.op.Mul(g.op.Unsqueeze(g.op.Cast(x, to=ir.DataType.FLOAT), g.constant([1], np.int64)), inv_freq)
                  for x in (p.row, p.col)]  # (N, 1) · (head_dim / 4,) -> (N, head_dim / 4)
        freqs = g.op.Concat(*angles, axis=-1)  # (N, head_dim / 2)
        cos, sin = (g.op.Cast(f(freqs), to=dtype) for f in (g.op.Cos, g.op.Sin))
        places = g.op.Unsqueeze(p.index, g.constant([0], np.int64))  # (1, N)
    return MultimodalRotary(cos, sin, head_dim, _positions=[places])


def attention(g: Graph, h: ir.Value, a: Weights, hidden: int, heads: int, rotary: MultimodalRotary,
              groups: AttentionGroups, target: Target) -> ir.Value:
    """Qwen2_5_VLVisionAttention (and Qwen3-VL's): fused qkv with bias, the 2-D rotary on q and k,
    attention in both directions within each of `groups`, proj with bias."""
    with g.scope("qkv"):
        qkv = linear(g, h, a("qkv.weight", 3 * hidden, hidden), target, a("qkv.bias", 3 * hidden))  # (1, N, 3H)
    q, k, v = g.op.Split(qkv, g.constant([hidden] * 3, np.int64), axis=-1, _outputs=3)  # q | k | v, heads within
    with g.scope("q_rotary"):
        q = rotary.rotate(g, q, heads, None, False)
    with g.scope("k_rotary"):
        k = rotary.rotate(g, k, heads, None, False)
    q, k, v = (groups.gather(g, x, hidden) for x in (q, k, v))
    h = g.ms.MultiHeadAttention(q, k, v, None, None, groups.bias, num_heads=heads, scale=(hidden // heads) ** -0.5)
    h = groups.scatter(g, h)
    with g.scope("proj"):
        return linear(g, h, a("proj.weight", hidden, hidden), target, a("proj.bias", hidden))


def block(g: Graph, stream: ResidualStream, w: Weights, c: Qwen2_5_VLVisionConfig, rotary: MultimodalRotary,
          groups: AttentionGroups, target: Target) -> None:
    """Qwen2_5_VLVisionBlock.forward: x + attn(norm1(x)), then x + mlp(norm2(x))."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("norm1"):
        h = stream.norm(w("norm1.weight", H))
    with g.scope("attn"):
        stream.add(attention(g, h, w.under("attn."), H, c.num_heads, rotary, groups, target))
    with g.scope("norm2"):
        h = stream.norm(w("norm2.weight", H))
    m = w.under("mlp.")
    with g.scope("mlp"):
        biases = (m("gate_proj.bias", I), m("up_proj.bias", I), m("down_proj.bias", H))
        stream.add(gated_mlp(g, h, m("gate_proj.weight", I, H), m("up_proj.weight", I, H), m("down_proj.weight", H, I),
                             c.hidden_act, target, biases))


def build(g: Graph, pixels: ir.Value, grid: ir.Value, ckpt: Checkpoint, c: Qwen2_5_VLVisionConfig,
          target: Target) -> ir.Value:
    """Records the encoder on `g`: pixel_values (N, C·T·P·P) and image_grid_thw (1, 3) ->
    image_features (N / merge², out_hidden_size), in the target's IO dtype."""
    H, m = c.hidden_size, c.spatial_merge_size
    tower = Weights(ckpt, prefix_holding(ckpt, "patch_embed.proj.weight", TOWER_PREFIXES))
    layout = patch_layout(g, pixels, grid, c, target)
    with g.scope("model", "visual", "patch_embed", "proj"):
        T, P = c.temporal_patch_size, c.patch_size
        # Conv3d [H, C, T, P, P] with kernel = stride over one patch's (C, T, P, P) values: a linear.
        kernel = tower("patch_embed.proj.weight", H, c.in_channels, T, P, P).reshaped(H, c.patch_values)
        x = linear(g, pixels, kernel, target)  # (N, C·T·P·P) -> (N, H)
    x = g.op.Unsqueeze(x, g.constant([0], np.int64))  # -> (1, N, H)
    # As in the decoders, fp16 builds keep the residual stream and its norms in float32.
    stream = ResidualStream(g, x, NORM_EPS, target, np.float32 if target.io_dtype == np.float16 else None)
    for i in range(c.depth):
        with g.scope("model", "visual", f"blocks.{i}"):
            groups = layout.full if i in c.fullatt_block_indexes else layout.window
            block(g, stream, tower.under(f"blocks.{i}."), c, layout.rotary, groups, target)
    merger = tower.under("merger.")
    wide = H * m * m
    with g.scope("model", "visual", "merger"):
        with g.scope("ln_q"):
            x = stream.norm(merger("ln_q.weight", H))  # (1, N, H)
        x = g.op.Reshape(x, g.constant([-1, wide], np.int64))  # (1, N, H) -> (N / m², m²·H): one row per group
        with g.scope("mlp.0"):
            x = linear(g, x, merger("mlp.0.weight", wide, wide), target, merger("mlp.0.bias", wide))
        with g.scope("mlp.1"):
            x = activation(g, x, "gelu", target)  # nn.GELU(): the exact erf form
        with g.scope("mlp.2"):
            return linear(g, x, merger("mlp.2.weight", c.out_hidden_size, wide), target,
                          merger("mlp.2.bias", c.out_hidden_size))  # (N / m², out_hidden_size)


def tower_model(record, width: int, ckpt: Checkpoint, c, target: Target, g: Graph | None = None) -> ir.Model:
    """A Qwen-VL vision model, its tower recorded by `record(g, pixels, grid, ckpt, c, target)`: inputs
    `pixel_values` (patches, C·T·P·P) in the target's IO dtype and `image_grid_thw` (1, 3) int64;
    output `image_features` (tokens, `width`)."""
    g = g or Graph()
    dtype = tensor_type(target.io_dtype)
    pixels = ir.Value(name="pixel_values", type=dtype, shape=ir.Shape(("num_patches", c.patch_values)))
    grid = ir.Value(name="image_grid_thw", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape((1, 3)))
    features = record(g, pixels, grid, ckpt, c, target)
    features.name, features.type = "image_features", dtype
    features.shape = ir.Shape(("num_image_tokens", width))
    return g.model([pixels, grid], [features])


def vision_model(ckpt: Checkpoint, c: Qwen2_5_VLVisionConfig, target: Target, g: Graph | None = None) -> ir.Model:
    """The whole vision model: image_features (tokens, out_hidden_size) from the patches (tower_model)."""
    return tower_model(build, c.out_hidden_size, ckpt, c, target, g)
