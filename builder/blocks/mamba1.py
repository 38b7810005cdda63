"""The Mamba-1 mixer (Jamba's; Mamba's and FalconMamba's have the same scan): a selective
state-space layer with a carried convolution state and a per-channel SSM state.

Reference: transformers/models/jamba/modular_jamba.py (JambaMambaMixer) and
transformers/models/mamba/modeling_mamba.py (mamba_selective_scan, the one-token update):

    x, z = split(in_proj(h))                          widths: intermediate, intermediate
    x = silu(conv1d(x))                               depthwise, causal, carried state
    dt, B, C = split(x_proj(x))                       widths: dt_rank, N, N
    dt, B, C = norm(dt), norm(B), norm(C)             Jamba's RMSNorms (not Mamba's, FalconMamba's)
    dt = softplus(dt_proj.weight · dt + dt_proj.bias) (B, S, intermediate), in float32
    h ← exp(dt · A) · h + (dt · x) ⊗ B                A = −exp(A_log), (intermediate, N): diagonal
    y = h · C + D · x
    out_proj(y · silu(z))

Unlike Mamba-2's, the decay exp(dt · A) differs along the state axis, so this is not
builder.blocks.linear_recurrence's gated rule (one decay per head); the scan is its own: a
standard-op Scan over the new tokens whose body is a handful of elementwise ops on the
(batch, intermediate, N) state, computed in float32 as transformers' scan is. Cost: one step per
token, each O(batch · intermediate · N) multiply-adds and ~10 small kernels (no (S, intermediate,
N) tensor is ever made, so a prompt costs no more memory than a decode step); a prompt of S tokens
is S sequential steps, where a fused kernel would parallelize over channels only.

A padding token (onnxruntime-genai pads shorter prompts on the right) gets dt = 0: exp(0 · A) = 1
and 0 · B · x = 0, so the state passes it unchanged. The model's inputs and outputs keep
transformers' cache layout, `past.%d.conv` (batch, intermediate, kernel − 1) and
`past.%d.recurrent` (batch, intermediate, N), both in the activation dtype; A_log, D, dt_proj's
bias and the conv stay float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.blocks.linear import linear
from builder.blocks.mlp import activation
from builder.blocks.norm import rms_norm
from builder.blocks.short_conv import Padding, causal_conv
from builder.graph import Graph
from builder.lazy import Weight
from builder.target import Target


@dataclass(frozen=True)
class Mamba1Spec:
    """A Mamba-1 mixer's sizes: `intermediate` channels, an SSM state of `state_size` per channel,
    a `conv_kernel`-tap conv, a time step of rank `dt_rank`; `eps` the inner RMSNorms' (Jamba's
    on dt, B and C; None: a mixer without them)."""

    intermediate: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    eps: float | None = None
    activation: str = "silu"

    @property
    def conv_state(self) -> tuple[int, int]:
        return self.intermediate, self.conv_kernel - 1

    @property
    def recurrent_state(self) -> tuple[int, int]:
        return self.intermediate, self.state_size


@dataclass(frozen=True)
class Mamba1Weights:
    """A mixer's checkpoint tensors (`Mamba1Weights.read(w, spec, hidden, ...)` reads the usual names)."""

    in_proj: Weight
    conv: Weight
    x_proj: Weight
    dt_proj: Weight
    dt_bias: Weight
    A_log: Weight
    D: Weight
    out_proj: Weight
    conv_bias: Weight | None = None
    in_proj_bias: Weight | None = None
    out_proj_bias: Weight | None = None
    dt_norm: Weight | None = None
    b_norm: Weight | None = None
    c_norm: Weight | None = None

    @classmethod
    def read(cls, w, spec: Mamba1Spec, hidden: int, conv_bias: bool, proj_bias: bool) -> Mamba1Weights:
        """in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj (and Jamba's dt/b/c_layernorm when
        `spec.eps` is set) under `w` (a builder.architecture.Weights); `proj_bias`: in_proj and
        out_proj have biases, `conv_bias`: conv1d has one."""
        I, N, R, H = spec.intermediate, spec.state_size, spec.dt_rank, hidden
        norms = spec.eps is not None
        return cls(
            in_proj=w("in_proj.weight", 2 * I, H), conv=w("conv1d.weight", I, 1, spec.conv_kernel),
            x_proj=w("x_proj.weight", R + 2 * N, I), dt_proj=w("dt_proj.weight", I, R), dt_bias=w("dt_proj.bias", I),
            A_log=w("A_log", I, N), D=w("D", I), out_proj=w("out_proj.weight", H, I),
            conv_bias=w("conv1d.bias", I) if conv_bias else None,
            in_proj_bias=w("in_proj.bias", 2 * I) if proj_bias else None,
            out_proj_bias=w("out_proj.bias", H) if proj_bias else None,
            dt_norm=w("dt_layernorm.weight", R) if norms else None,
            b_norm=w("b_layernorm.weight", N) if norms else None,
            c_norm=w("c_layernorm.weight", N) if norms else None,
        )


def mamba1_mixer(
    g: Graph, h: ir.Value, w: Mamba1Weights, spec: Mamba1Spec, conv_past: ir.Value, ssm_past: ir.Value,
    pad: Padding, target: Target,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The mixer on h (B, S, hidden); returns (its output, the present conv state, the present SSM
    state)."""
    dtype = np.dtype(target.io_dtype)
    f32 = ir.DataType.FLOAT
    I, N, R = spec.intermediate, spec.state_size, spec.dt_rank
    with g.scope("in_proj"):
        xz = linear(g, h, w.in_proj, target, w.in_proj_bias)
    x, z = g.op.Split(xz, g.constant([I, I], "int64"), axis=-1, _outputs=2)
    x, conv_present = causal_conv(g, x, conv_past, w.conv, w.conv_bias, pad, target, scope="conv1d")
    x = g.op.Mul(activation(g, x, spec.activation), pad.keep)  # padding zeroed, as transformers masks it
    with g.scope("x_proj"):
        dbc = linear(g, x, w.x_proj, target)
    dt, b, c = g.op.Split(dbc, g.constant([R, N, N], "int64"), axis=-1, _outputs=3)
    def norm(v: ir.Value, name: str, weight: Weight | None) -> ir.Value:
        if weight is None:
            return v
        with g.scope(name):
            return rms_norm(g, v, weight, spec.eps, target)

    dt, b, c = norm(dt, "dt_layernorm", w.dt_norm), norm(b, "b_layernorm", w.b_norm), norm(c, "c_layernorm", w.c_norm)
    with g.scope("dt_proj"):  # the weight alone: its bias is added in float32 before the softplus
        dt = linear(g, dt, w.dt_proj, target)
    neg_a = g.weight("neg_exp_A_log", w.A_log.map(lambda a: -np.exp(a.astype(np.float32)), np.float32))
    d = g.weight("D", w.D.astype(np.float32))
    dt_bias = g.weight("dt_bias", w.dt_bias.astype(np.float32))
    with g.scope("ssm"):
        if dtype != np.float32:
            x, dt, b, c, ssm_past = (g.op.Cast(v, to=f32) for v in (x, dt, b, c, ssm_past))
        keep = pad.keep if dtype == np.float32 else g.op.Cast(pad.keep, to=f32)
        dt = g.op.Mul(g.op.Softplus(g.op.Add(dt, dt_bias)), keep)  # 0 on padding: the state passes it
        y, ssm_present = selective_scan(g, x, dt, b, c, neg_a, d, ssm_past)
        y = g.op.Mul(y, activation(g, z if dtype == np.float32 else g.op.Cast(z, to=f32), "silu"))
        if dtype != np.float32:
            y = g.op.Cast(y, to=ir.DataType.from_numpy(dtype))
            ssm_present = g.op.Cast(ssm_present, to=ir.DataType.from_numpy(dtype))
    with g.scope("out_proj"):
        return linear(g, y, w.out_proj, target, w.out_proj_bias), conv_present, ssm_present


def selective_scan(g: Graph, x: ir.Value, dt: ir.Value, b: ir.Value, c: ir.Value, neg_a: ir.Value, d: ir.Value,
                   past: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Mamba-1's scan in float32 over x, dt (B, S, I) (dt after its softplus), b, c (B, S, N),
    with A = `neg_a` (I, N), D = `d` (I,) and the state `past` (B, I, N):
    h ← exp(dt · A) · h + (dt · x) ⊗ b, y = h · c + D · x. Returns (y (B, S, I), the present
    state)."""
    seq_first = [1, 0, 2]
    u = g.op.Mul(dt, x)  # dt · x, the input each token writes
    scanned = [g.op.Transpose(v, perm=seq_first) for v in (dt, u, b, c)]  # (S, B, ·)
    present, y = g.op.Scan(past, *scanned, body=_step(g, neg_a), num_scan_inputs=4, _outputs=2)  # y (S, B, I)
    y = g.op.Transpose(y, perm=seq_first)
    return g.op.Add(y, g.op.Mul(x, d)), present


def _step(outer: Graph, neg_a: ir.Value) -> ir.Graph:
    """The Scan body: one token's update of the (B, I, N) state and its output h · c (B, I);
    A is read from the outer graph."""
    elem = ir.DataType.FLOAT

    def value(name: str) -> ir.Value:
        return ir.Value(name=f"{outer.path}/step/{name}", type=ir.TensorType(elem))

    state, dt, u, b, c = (value(n) for n in ("state", "dt", "u", "b", "c"))
    body = Graph()
    last, middle = outer.constant([-1], "int64"), outer.constant([1], "int64")
    with body.scope(*outer.path.strip("/").split("/"), "step"):
        decay = body.op.Exp(body.op.Mul(body.op.Unsqueeze(dt, last), neg_a))  # exp(dt · A): (B, I, N)
        written = body.op.Mul(body.op.Unsqueeze(u, last), body.op.Unsqueeze(b, middle))  # (dt · x) ⊗ b
        new_state = body.op.Add(body.op.Mul(decay, state), written)
        out = body.op.Squeeze(body.op.MatMul(new_state, body.op.Unsqueeze(c, last)), last)  # h · c: (B, I)
    for result in (new_state, out):
        result.type = ir.TensorType(elem)
    return ir.Graph(inputs=[state, dt, u, b, c], outputs=[new_state, out], nodes=body.tape.nodes,
                    name="selective_scan_step")


__all__ = ["Mamba1Spec", "Mamba1Weights", "mamba1_mixer", "selective_scan"]
