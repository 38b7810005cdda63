"""The Mamba-2 mixer (Granite 4.0's, Nemotron-H's, Falcon-H1's, Bamba's): a selective state-space
layer with a carried convolution state and SSM state.

Reference: transformers/models/bamba/modeling_bamba.py (BambaMixer.torch_forward, which
GraniteMoeHybridMambaLayer is), with the chunked scan (prefill) and selective_state_update (decode):

    z, xBC, dt = split(in_proj(h))                       widths: intermediate, conv_dim, heads
    xBC = silu(conv1d(xBC))                              depthwise, causal, carried state
    x, B, C = split(xBC)                                 widths: intermediate, groups·N, groups·N
    dt = clip(softplus(dt + dt_bias), time_step_limit)   (B, S, heads)
    S ← S · exp(dt · A) + (dt · x) ⊗ B                   A = −exp(A_log), per head; B, C per group
    y = S · C + D · x
    out_proj(norm(y · silu(z)))                          an RMSNorm over each group's channels
                                                         (Falcon-H1's may norm y first: norm(y) · silu(z))

The recurrence is the plain gated rule of builder.blocks.linear_recurrence with q = C, k = B,
v = dt · x and g = dt · A, in float32 (transformers' chunked scan runs in float32). Its state is
(heads, N, head_dim) there; the model's inputs and outputs keep transformers' cache layout,
`past.%d.recurrent` (batch, heads, head_dim, N), and `past.%d.conv` (batch, conv_dim, kernel−1),
both in the activation dtype. The conv kernel, A_log, D, dt_bias and the norm stay float.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.blocks.linear import linear
from builder.blocks.linear_recurrence import RecurrentHeads, linear_recurrence
from builder.blocks.mlp import activation
from builder.blocks.short_conv import Padding, causal_conv
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


@dataclass(frozen=True)
class Mamba2Spec:
    """A Mamba-2 mixer's sizes: `heads` of `head_dim` channels, B and C in `groups` groups of
    `state_size`, a `conv_kernel`-tap conv. `norm_groups`: the groups the gated RMSNorm normalizes
    apart (Granite's and Bamba's: `groups`; Falcon-H1's and Nemotron-H's own keys); `norm` False
    for a mixer without it (Falcon-H1's `mamba_rms_norm: false` gates only); `norm_before_gate`:
    norm(y) · silu(z) instead of norm(y · silu(z)) (Falcon-H1's `mamba_norm_before_gate`)."""

    heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int
    eps: float
    activation: str = "silu"
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    norm: bool = True
    norm_groups: int | None = None
    norm_before_gate: bool = False

    @property
    def intermediate(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate + 2 * self.groups * self.state_size

    @property
    def projection(self) -> int:
        """in_proj's width: z, then xBC, then dt."""
        return self.intermediate + self.conv_dim + self.heads

    @property
    def conv_state(self) -> tuple[int, int]:
        return self.conv_dim, self.conv_kernel - 1

    @property
    def recurrent_state(self) -> tuple[int, int, int]:
        return self.heads, self.head_dim, self.state_size


@dataclass(frozen=True)
class Mamba2Weights:
    """A mixer's checkpoint tensors (`Mamba2Weights.read(w, spec)` reads the usual names)."""

    in_proj: Weight
    conv: Weight
    dt_bias: Weight
    A_log: Weight
    D: Weight
    out_proj: Weight
    norm: Weight | None = None
    conv_bias: Weight | None = None
    in_proj_bias: Weight | None = None
    out_proj_bias: Weight | None = None

    @classmethod
    def read(cls, w, spec: Mamba2Spec, hidden: int, conv_bias: bool, proj_bias: bool,
             out_bias: bool | None = None) -> Mamba2Weights:
        """in_proj, conv1d, dt_bias, A_log, D, norm, out_proj under `w` (a builder.architecture.Weights);
        `proj_bias` says whether in_proj has a bias, `out_bias` whether out_proj has one (as
        in_proj, unless said: Falcon-H1 has a key for each)."""
        out_bias = proj_bias if out_bias is None else out_bias
        H, P = hidden, spec.intermediate
        return cls(
            in_proj=w("in_proj.weight", spec.projection, H), conv=w("conv1d.weight", spec.conv_dim, 1, spec.conv_kernel),
            dt_bias=w("dt_bias", spec.heads), A_log=w("A_log", spec.heads), D=w("D", spec.heads),
            out_proj=w("out_proj.weight", H, P), norm=w("norm.weight", P) if spec.norm else None,
            conv_bias=w("conv1d.bias", spec.conv_dim) if conv_bias else None,
            in_proj_bias=w("in_proj.bias", spec.projection) if proj_bias else None,
            out_proj_bias=w("out_proj.bias", H) if out_bias else None,
        )


def mamba2_mixer(
    g: Graph, h: ir.Value, w: Mamba2Weights, spec: Mamba2Spec, conv_past: ir.Value, ssm_past: ir.Value,
    pad: Padding, target: Target,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The mixer on h (B, S, hidden); returns (its output, the present conv state, the present SSM
    state)."""
    dtype = target.io_dtype
    with g.scope("in_proj"):
        zxbcdt = linear(g, h, w.in_proj, target, w.in_proj_bias)
    z, xbc, dt = g.op.Split(zxbcdt, g.constant([spec.intermediate, spec.conv_dim, spec.heads], "int64"), axis=-1,
                            _outputs=3)
    xbc, conv_present = causal_conv(g, xbc, conv_past, w.conv, w.conv_bias, pad, target, scope="conv1d")
    xbc = activation(g, xbc, spec.activation)
    y, ssm_present = _ssm(g, xbc, dt, w, spec, ssm_past, pad, dtype, fused=target.provider.linear_attention)
    with g.scope("norm"):
        y = _gated_norm(g, y, z, w.norm, spec, target)
    with g.scope("out_proj"):
        return linear(g, y, w.out_proj, target, w.out_proj_bias), conv_present, ssm_present


def _ssm(g: Graph, xbc: ir.Value, dt: ir.Value, w: Mamba2Weights, spec: Mamba2Spec, past: ir.Value, pad: Padding,
         dtype: np.dtype, fused: bool) -> tuple[ir.Value, ir.Value]:
    """The selective scan in float32: y (B, S, intermediate), in float32, and the present SSM state
    in `dtype`. `fused`: ONNX Runtime's LinearAttention (CPU), else a Scan."""
    N, G, P, heads = spec.state_size, spec.groups, spec.head_dim, spec.heads
    f32 = ir.DataType.FLOAT
    dt_bias = g.weight("dt_bias", w.dt_bias.astype(np.float32))
    neg_a = g.weight("neg_exp_A_log", w.A_log.map(lambda a: -np.exp(a.astype(np.float32)), np.float32))
    d = g.weight("D", w.D.astype(np.float32))
    with g.scope("ssm"):
        if dtype != np.float32:
            xbc, dt, past = (g.op.Cast(v, to=f32) for v in (xbc, dt, past))
        x, b, c = g.op.Split(xbc, g.constant([spec.intermediate, G * N, G * N], "int64"), axis=-1, _outputs=3)
        x = g.op.Reshape(x, g.constant([0, 0, heads, P], "int64"))  # (B, S, heads·P) -> (B, S, heads, P)
        b = g.op.Reshape(b, g.constant([0, 0, G, N], "int64"))
        c = g.op.Reshape(c, g.constant([0, 0, G, N], "int64"))
        dt = _time_step(g, g.op.Softplus(g.op.Add(dt, dt_bias)), spec.time_step_limit)  # (B, S, heads)
        decay = g.op.Mul(dt, neg_a)  # dt · A, (B, S, heads)
        v = g.op.Mul(x, g.op.Unsqueeze(dt, g.constant([3], "int64")))  # dt · x
        keep = pad.keep if dtype == np.float32 else g.op.Cast(pad.keep, to=f32)
        state = g.op.Transpose(past, perm=[0, 1, 3, 2])  # (B, heads, P, N) -> (B, heads, N, P)
        heads_ = RecurrentHeads(key_heads=G, value_heads=heads, key_dim=N, value_dim=P)
        y, present = linear_recurrence(g, c, b, v, decay, None, keep, state, heads_, fused)
        y = g.op.Add(y, g.op.Mul(x, g.op.Unsqueeze(d, g.constant([1], "int64"))))  # + D · x, D (heads, 1)
        y = g.op.Reshape(y, g.constant([0, 0, spec.intermediate], "int64"))
        present = g.op.Transpose(present, perm=[0, 1, 3, 2])  # back to (B, heads, P, N)
        if dtype != np.float32:
            present = g.op.Cast(present, to=ir.DataType.from_numpy(np.dtype(dtype)))
    return y, present


def _time_step(g: Graph, dt: ir.Value, limit: tuple[float, float]) -> ir.Value:
    """dt clamped to `limit` when more than one token is new: transformers' chunked scan (prefill)
    clamps, its one-token update (decode) does not, nor does mamba_ssm's. The default (0, inf) is
    no clamp at all."""
    low, high = limit
    if (low, high) == (0.0, math.inf):
        return dt
    clipped = g.op.Clip(dt, g.constant(low, np.float32), g.constant(min(high, np.finfo(np.float32).max), np.float32))
    prefill = g.op.Greater(g.op.Shape(dt, start=1, end=2), g.constant([1], "int64"))  # (1,): S > 1
    return g.op.Where(prefill, clipped, dt)


def _gated_norm(g: Graph, y: ir.Value, z: ir.Value, weight: Weight | None, spec: Mamba2Spec,
                target: Target) -> ir.Value:
    """MambaRMSNormGated, in float32 (y is): weight · RMSNorm(y · silu(z)) over each of the norm's
    groups of channels, or weight · RMSNorm(y) · silu(z) with `spec.norm_before_gate`; only the
    gate where the mixer has no norm. Returns the IO dtype."""
    dtype = np.dtype(target.io_dtype)
    if dtype != np.float32:
        z = g.op.Cast(z, to=ir.DataType.FLOAT)
    gate = activation(g, z, "silu")
    after = weight is not None and spec.norm_before_gate
    x = y if after else g.op.Mul(y, gate)
    if weight is not None:
        groups, scale = spec.norm_groups or spec.groups, g.weight("weight", weight.astype(np.float32))
        if groups == 1:
            x = g.op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=float(spec.eps), stash_type=1)
        else:  # each group apart: (B, S, groups·size) -> (B, S, groups, size), normalized, then scaled
            size = spec.intermediate // groups
            x = g.op.Reshape(x, g.constant([0, 0, groups, size], "int64"))
            x = g.op.SimplifiedLayerNormalization(x, g.constant(np.ones(size, np.float32)), axis=-1,
                                                  epsilon=float(spec.eps), stash_type=1)
            x = g.op.Mul(g.op.Reshape(x, g.constant([0, 0, spec.intermediate], "int64")), scale)
    if after:
        x = g.op.Mul(x, gate)
    return x if dtype == np.float32 else g.op.Cast(x, to=ir.DataType.from_numpy(dtype))


__all__ = ["Mamba2Spec", "Mamba2Weights", "mamba2_mixer"]
