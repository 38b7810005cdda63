"""Ergo (architectures/ergo.py: DeepSeek-V3's sigmoid router over relu² experts each normed by its
own weight, a normed shared expert, fused-QKV attention with q/k norms that rotates interleaved
pairs on sliding layers alone and scales the full layers' logits, sandwich norms and gated
residuals) against transformers: the shared family proofs (tests/family_runner.py), routing that
the correction bias decides, each special feature moving the logits, and refusals.

The int4 proof rounds the stacked experts too (ErgoExperts' up_proj [E, H, I] / down_proj
[E, I, H], x · W, which the build's QMoE quantizes as [I, H] / [H, I] matrices), one expert at a
time, and keeps the router (`gate.linear`, an nn.Linear) in float as the build does."""

import numpy as np
import pytest
import torch
import transformers
from family_runner import FamilyTest, family_tests, load
from fake_quant import fake_quantize, fake_quantize_model
from helpers import GENAI_PROMPT, PROMPT, relative_error
from safetensors.numpy import load_file, save_file

import architectures
from builder.errors import BuildError

ARCHITECTURE = "ErgoForCausalLM"
FULL, SLIDING = "full_attention", "sliding_attention"
ROUTER_SCALE = 10.0  # random routers are near-uniform; scaled up (not to saturation), their choices are decisive
# 4 query heads of 16 over 2 KV heads on a hidden size of 64; experts of 32, a shared expert of 48.
BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128, first_dense_intermediate_size=96, moe_intermediate_size=32,
            shared_intermediate_size=48, rms_norm_eps=1e-6)
VARIANTS = {
    # ErgoConfig's pattern at period 2 (sliding, full, sliding, full), the first layer dense, a window
    # of 4 (shorter than the prompt), the full layers' logits times 2.5, theta 1e4, top-3 of 8.
    "pattern": dict(global_attention_every_n_layers=2, sliding_window=4, global_attention_scale=2.5,
                    rope_theta=1e4, num_experts=8, num_experts_per_tok=3),
    # The released configs' spelling of the window (3), layer lists given (a full layer first, a dense
    # layer between sparse ones), YaRN on the sliding layers, no global scale, top-2 of 4, the
    # default routed scaling, tie_word_embeddings ignored.
    "lists": dict(local_attention_window=3, layer_types=[FULL, SLIDING, SLIDING, FULL],
                  mlp_layer_types=["sparse", "dense", "sparse", "sparse"], num_experts=4, num_experts_per_tok=2,
                  tie_word_embeddings=True, rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                                                 original_max_position_embeddings=8)),
}




def make(folder, config):
    """transformers' random checkpoint (saved in the training framework's layout, as the hub's) with
    the routers scaled up and what transformers initializes to constants randomized: the correction
    bias (zeros), every norm's weight (ones), the expert norms (ones) and the residual gates (zeros)."""
    from helpers import make_checkpoint

    make_checkpoint(folder, "ErgoConfig", **config)
    tensors, rng = load_file(folder / "model.safetensors"), np.random.default_rng(1)
    for key, value in tensors.items():
        if key.endswith("gate_kernel"):
            tensors[key] = value * ROUTER_SCALE
        elif key == "output.weight":  # logits of a useful spread: greedy steps without near-ties
            tensors[key] = value * 10
        elif key.endswith("router_bias"):
            tensors[key] = (0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
        elif key.endswith("_residual.scale"):
            tensors[key] = rng.standard_normal(value.shape).astype(value.dtype)
        elif "norm" in key:
            tensors[key] = (1 + 0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def fake_quantize_experts(model, bits=4, block_size=32, symmetric=True, method="rtn"):
    """Every Linear but the float router rounded as the build rounds it, and each expert's [H, I] /
    [I, H] (x · W) matrix rounded as the [I, H] / [H, I] matrix QMoE holds."""
    from builder.quantize import dequantize, quantize

    def rounded(w):
        if method == "rtn":
            return fake_quantize(w, bits, block_size, symmetric)
        m = quantize(w.detach().numpy(), bits, block_size, symmetric, np.float32, method)
        return torch.from_numpy(dequantize(m, w.shape[1], bits))

    routers = {n: m.weight.detach().clone() for n, m in model.named_modules() if n.endswith("mlp.gate.linear")}
    fake_quantize_model(model, bits, block_size, symmetric, method=method)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name in routers:
                module.weight.copy_(routers[name])
            if type(module).__name__ == "ErgoExperts":
                for p in (module.up_proj, module.down_proj):
                    for e in range(p.shape[0]):
                        p[e].copy_(rounded(p[e].T.contiguous()).T)


SPEC = FamilyTest(
    ARCHITECTURE, "ErgoConfig", VARIANTS, base=BASE, make=make, ragged=True, fp16_tolerance=2e-2,
    layer_lists=True, name="ergo", genai_variant="pattern", quantize=fake_quantize_experts,
    config_raws=(
        {},
        # as the released config.json spells it: the window under its own name, a flat rope_theta
        dict(vocab_size=262144, hidden_size=8192, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
             local_attention_window=512, rope_theta=1000000.0, global_attention_every_n_layers=4,
             global_attention_scale=1.25, first_dense_intermediate_size=32768, num_dense_blocks=1,
             moe_intermediate_size=4096, shared_intermediate_size=8192, num_experts=256, num_experts_per_tok=8,
             max_position_embeddings=524288, rms_norm_eps=1e-12, model_type="ergo"),
        dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=8192), num_dense_blocks=3),
    ),
    config_fields=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "sliding_window",
                   "rms_norm_eps", "layer_types", "mlp_layer_types", "first_dense_intermediate_size",
                   "moe_intermediate_size", "shared_intermediate_size", "num_experts", "num_experts_per_tok",
                   "moe_routed_scaling_factor", "global_attention_scale"),
)
globals().update(family_tests(SPEC))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: SPEC.checkpoint(tmp_path_factory.mktemp(name), name) for name in VARIANTS}


def test_routing_is_decisive_and_the_bias_changes_it(checkpoints):
    # The parity proofs prove the router only if its choices are clear-cut (no near-tie an ulp
    # could flip) and if the correction bias changes some token's experts.
    by_bias = 0
    for name in VARIANTS:
        model = load(checkpoints[name])
        k = model.config.num_experts_per_tok
        routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        seen = []
        hooks = [r.register_forward_hook(lambda m, i, o: seen.append((o[0].double().numpy(), m))) for r in routers]
        with torch.no_grad():
            for ids in (PROMPT, GENAI_PROMPT):
                model(torch.tensor([ids]))
        for h in hooks:
            h.remove()
        for logits, router in seen:
            s = 1 / (1 + np.exp(-logits))
            choice = s + router.e_score_correction_bias.double().numpy()
            top = np.sort(choice, -1)[:, ::-1]
            assert (top[:, k - 1] - top[:, k]).min() > 1e-3, "a near-tie in the top-k choice"
            chosen = np.sort(np.argsort(-choice, -1)[:, :k], -1)
            by_bias += (chosen != np.sort(np.argsort(-s, -1)[:, :k], -1)).any(-1).sum()
    assert by_bias > 0, "the correction bias never changes the experts chosen"


@pytest.mark.parametrize("change", ["residual_gates", "expert_norms", "shared_expert_norm", "global_scale",
                                    "routed_scaling", "window"])
def test_the_features_move_the_logits(change, checkpoints):
    # A build that left out any of these would fail the fp32 proof: each changed in transformers
    # moves its logits far past the tolerance.
    model = load(checkpoints["pattern"])
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits.numpy()
        for layer in model.model.layers:
            if change == "residual_gates":
                layer.attention_residual_gate.weight.zero_()
                layer.feedforward_residual_gate.weight.zero_()
            elif change == "expert_norms" and hasattr(layer.mlp, "experts"):
                layer.mlp.experts.post_expert_norm.weight.fill_(1.0)
            elif change == "shared_expert_norm" and hasattr(layer.mlp, "shared_experts"):
                layer.mlp.shared_experts.norm.weight.fill_(1.0)
            elif change == "global_scale":
                layer.self_attn.qk_scale = None
            elif change == "routed_scaling" and hasattr(layer.mlp, "gate"):
                layer.mlp.gate.routed_scaling_factor = 1.0
            elif change == "window":
                model.config.sliding_window = len(PROMPT)  # the masks read the config's window
        got = model(torch.tensor([PROMPT])).logits.numpy()
    assert relative_error(got, want) > 100 * SPEC.tolerance


def test_the_expert_norm_differs_from_norming_the_sum(checkpoints):
    # Each route is normed before the weighted sum: norming the sum instead (what a fused MoE
    # would allow) is another model.
    model = load(checkpoints["pattern"])
    moe = next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    x = torch.randn(5, 64)
    with torch.no_grad():
        _, weights, index = moe.gate(x)
        want = moe.experts(x, index, weights)
        raw = torch.zeros_like(x)
        for j in range(index.shape[1]):
            for t in range(x.shape[0]):
                e = int(index[t, j])
                raw[t] += weights[t, j] * (torch.relu(x[t] @ moe.experts.up_proj[e]) ** 2 @ moe.experts.down_proj[e])
        normed_sum = torch.nn.functional.rms_norm(raw, (64,), eps=1e-6)
    assert relative_error(normed_sum.numpy(), want.numpy()) > 1e-2


def transformers_fails(raw) -> bool:
    try:
        config = transformers.ErgoConfig(**{**BASE, **raw})
        model = transformers.ErgoForCausalLM(config).eval()
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT])).logits
        return not torch.isfinite(logits).all()
    except Exception:  # noqa: BLE001 - any failure is transformers refusing
        return True


def parse(raw):
    return architectures.load(ARCHITECTURE).parse_config({**BASE, **raw, "architectures": [ARCHITECTURE]},
                                                         ARCHITECTURE)


@pytest.mark.parametrize("raw, message", [
    (dict(num_experts=4, num_experts_per_tok=5), "num_experts_per_tok=5 of 4 experts"),  # its top-k fails
    (dict(global_attention_every_n_layers=0), "global_attention_every_n_layers 0"),  # modulo by zero
    (dict(mlp_layer_types=["dense", "sparse"]), "mlp_layer_types has 2 entries for 4 layers"),  # IndexError
])
def test_refused_where_transformers_fails(raw, message):
    assert transformers_fails(raw)
    with pytest.raises(BuildError, match=message):
        parse(raw)


def test_a_negative_global_scale_is_refused():
    # transformers multiplies q and k by the scale's complex square root and runs; builder refuses.
    assert not transformers_fails(dict(global_attention_scale=-1.0))
    with pytest.raises(BuildError, match="global_attention_scale -1.0"):
        parse(dict(global_attention_scale=-1.0))


def test_per_layer_type_rope_is_read_as_transformers_keeps_it():
    # What save_pretrained writes: one entry per layer type (a full layer with an entry rotates too).
    rope = {SLIDING: dict(rope_type="default", rope_theta=1e4), FULL: dict(rope_type="default", rope_theta=1e5)}
    theirs = transformers.ErgoConfig(**BASE, rope_parameters=rope).rope_parameters
    assert parse(dict(rope_parameters=rope)).rope_parameters == theirs


def test_the_head_is_the_hidden_size_over_the_heads():
    # ErgoAttention's head_dim is hidden_size // heads whatever config.json says.
    assert parse(dict(head_dim=32)).head_dim == 16
