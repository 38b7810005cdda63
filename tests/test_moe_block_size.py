"""QMoE experts whose sizes the requested int4 block does not divide (builder.blocks.moe's
expert_block_size): a smaller power-of-two block that divides them, else the requested block with
a short last block; each against transformers on the same fake quantization at accuracy level 0."""

import onnx
import pytest
import torch
from conftest import TINY
from fake_quant import fake_quantize
from helpers import build, make_checkpoint
from safetensors.numpy import load_file, save_file
from test_family_moe import ROUTER_SCALE, assert_rounded_parity

from builder.blocks.moe import expert_block_size
from builder.errors import BuildError
from builder.target import Quantization

QWEN3_MOE = dict(TINY, eos_token_id=255, num_experts=4, head_dim=32, num_experts_per_tok=2, norm_topk_prob=False)


def qwen3_moe(folder, moe_intermediate_size):
    make_checkpoint(folder, "Qwen3MoeConfig", moe_intermediate_size=moe_intermediate_size, **QWEN3_MOE)
    tensors = load_file(folder / "model.safetensors")
    for key in tensors:
        if key.endswith("mlp.gate.weight"):  # a decisive router: rounding cannot flip its top-k choice
            tensors[key] = tensors[key] * ROUTER_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def rounding(block_size, expert_block):
    """Every Linear (attention, lm_head) at the build's block, the stacked experts at theirs."""
    def apply(model):
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(fake_quantize(module.weight, 4, block_size, True))
                for p in (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)):
                    if isinstance(p, torch.nn.Parameter) and p.dim() == 3:
                        for e in range(p.shape[0]):
                            p[e].copy_(fake_quantize(p[e], 4, expert_block, True))
    return apply


def qmoe_block_sizes(out):
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    return {a.i for n in graph.node if n.op_type == "QMoE" for a in n.attribute if a.name == "block_size"}


@pytest.mark.parametrize("moe_intermediate_size, expert_block", [
    (80, 16),  # 80 = 5 · 16: block 16 for the layer's experts, MLAS's fast kernels kept
    (72, 32),  # no power of two from 16 divides 72: blocks of 32, the last of 8
])
def test_int4_experts_not_divisible_by_the_block_match_transformers(tmp_path, moe_intermediate_size, expert_block):
    source = qwen3_moe(tmp_path / "src", moe_intermediate_size)
    out = build(source, tmp_path / "out", "-p", "int4", "--block-size", "32", "--accuracy-level", "0",
                "--quant-method", "rtn", "--symmetric")
    assert qmoe_block_sizes(out) == {expert_block}
    assert_rounded_parity(out, source, rounding(32, expert_block))


def test_expert_block_size():
    q32, q64 = Quantization(4, 32, True), Quantization(4, 64, True)
    assert expert_block_size(64, 64, q32) == 32  # divides: unchanged
    assert expert_block_size(64, 80, q32) == 16
    assert expert_block_size(2880, 2880, Quantization(4, 128, True)) == 64  # gpt-oss at --block-size 128
    assert expert_block_size(48, 64, q64) == 16  # the hidden size counts too
    assert expert_block_size(64, 72, q32) == 32  # short last block
    assert expert_block_size(64, 81, Quantization(8, 32, True)) == 32
    with pytest.raises(BuildError, match="even"):
        expert_block_size(64, 81, q32)
