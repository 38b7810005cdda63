"""Qwen3.5's multi-token-prediction head (mtp.*) built as mtp.onnx beside the decoder, and speculative
decoding with it (builder.speculative): the head against its math in transformers' own modules, the
package as onnxruntime-genai opens it (the vocabulary stored once), greedy speculative output equal
to plain greedy decoding and transformers' generate, and the refusals."""

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
import transformers
from helpers import build, make_checkpoint, relative_error
from mtp_head import add_mtp_head, add_nextn_head, head_reference
from test_family_qwen3_5 import CONFIG as DENSE
from test_family_qwen3_5_moe import CONFIG as MOE
from test_family_qwen3_5_moe import NEXT, scale_routers
from test_family_deepseek_v3 import make as make_deepseek
from test_family_glm4_moe import CONFIG as GLM

from builder.cli import main
from builder.speculative import Speculative

PROMPTS = ([5, 17, 33, 12, 99, 100, 7, 8, 61, 42], [9, 4], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4])
MAX_LENGTH = 48


def _causal(config_class, config, decisive=False):
    def make(folder):
        make_checkpoint(folder, config_class, **config)
        if decisive:  # routers scaled up: int4 rounding does not flip the decoder's expert choices
            scale_routers(folder)
        return add_mtp_head(folder)
    return make


def _conditional(folder):
    """The hub's layout: Qwen3_5ForConditionalGeneration, the decoder under model.language_model.*,
    the head at the top (mtp.*), as the hub's checkpoints store it."""
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64, patch_size=4)
    model = transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=DENSE, vision_config=vision)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    return add_mtp_head(folder)


VARIANTS = {
    "dense": _causal("Qwen3_5TextConfig", DENSE),
    "moe": _causal("Qwen3_5MoeTextConfig", MOE, decisive=True),
    "conditional": _conditional,
    "next": _causal("Qwen3NextConfig", NEXT),  # Qwen3-Next: the same head names and layer kind
    # DeepSeek-V3 and GLM-4.5: a next-token module at model.layers.{num_hidden_layers}, a latent-attention
    # (DeepSeek) or GQA (GLM) layer with experts.
    "deepseek_v3": lambda folder: add_nextn_head(make_deepseek(folder)),
    "glm4_moe": lambda folder: add_nextn_head(make_checkpoint(folder, "Glm4MoeConfig", **GLM)),
}


def _reference(source):
    """The head's math in transformers' modules: Qwen's mtp.* or DeepSeek's and GLM's next-token module."""
    return head_reference(source, _decoder(source))


@pytest.fixture(scope="module", params=list(VARIANTS))
def package(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"mtp_{request.param}")
    source = VARIANTS[request.param](folder / "src")
    return source, build(source, folder / "out", "-p", "fp32")


def _decoder(source):
    """transformers' model of the checkpoint: the multimodal class for the hub's layout."""
    auto = transformers.AutoModelForImageTextToText if "model.language_model." in _names(source) else \
        transformers.AutoModelForCausalLM
    return auto.from_pretrained(source, dtype=torch.float32).eval()


def _names(source) -> str:
    from safetensors import safe_open

    with safe_open(source / "model.safetensors", "np") as f:
        return " ".join(f.keys())


def _hidden(model, ids):
    """The decoder's last hidden states (after its final norm: lm_head's input) and its greedy tokens."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0].numpy(), out.logits[0].argmax(-1).numpy()


def _head(out, pairs_hidden, tokens, past=None, length=0):
    session = ort.InferenceSession(str(out / "mtp.onnx"), providers=["CPUExecutionProvider"])
    kv = session.get_inputs()[3].shape
    past = past or {f"past_key_values.0.{k}": np.zeros((1, kv[1], 0, kv[3]), np.float32) for k in ("key", "value")}
    feed = {"input_ids": np.asarray([tokens], np.int64), "attention_mask": np.ones((1, length + len(tokens)), np.int64),
            "hidden_states": np.asarray(pairs_hidden, np.float32)[None], **past}
    logits, key, value, hidden = session.run(None, feed)
    return logits[0], hidden[0], {"past_key_values.0.key": key, "past_key_values.0.value": value}


def test_head_matches_its_math(package):
    # The pairs (h_i, t_{i+1}) of a prompt, at positions 0..n-2, then two more pairs over the head's
    # own KV cache: logits and hidden_states_out against the head written out in transformers' modules.
    source, out = package
    ids = PROMPTS[2]
    hidden, _ = _hidden(_decoder(source), ids)
    reference = _reference(source)
    want_logits, want_hidden = reference(hidden[:-1], ids[1:], np.arange(len(ids) - 1))
    # Its logits are the last position's alone (what a draft reads).
    cut = len(ids) - 3
    logits, h, past = _head(out, hidden[:cut], ids[1:cut + 1])
    more_logits, more_h, _ = _head(out, hidden[cut:-1], ids[cut + 1:], past, cut)
    got_logits, got_hidden = np.concatenate([logits, more_logits]), np.concatenate([h, more_h])
    want_logits = want_logits[[cut - 1, -1]]
    assert relative_error(got_logits, want_logits) < 1e-4, relative_error(got_logits, want_logits)
    assert relative_error(got_hidden, want_hidden) < 1e-4
    assert (got_logits.argmax(-1) == want_logits.argmax(-1)).all()


def test_decoder_outputs_the_hidden_states_lm_head_reads(package):
    source, out = package
    ids = PROMPTS[0]
    want, _ = _hidden(_decoder(source), ids)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {i.name: np.zeros([1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape],
                             np.float32) for i in session.get_inputs() if i.name.startswith("past")}
    feed |= {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))["hidden_states"][0]
    assert relative_error(got, want) < 1e-4


def test_package_stores_the_vocabulary_once(package):
    # mtp.onnx reads the embedding and lm_head from model.onnx.data; genai_config.json declares the
    # head and the decoder's hidden_states, and onnxruntime-genai opens the package as written.
    import onnxruntime_genai as og

    _, out = package
    head = ir.load(out / "mtp.onnx")
    located = {n: v.const_value.location for n, v in head.graph.initializers.items()
               if isinstance(v.const_value, ir.ExternalTensor)}
    assert located["model.embed_tokens.weight"] == "model.onnx.data"
    assert located["lm_head.weight"] == "model.onnx.data"
    config = json.loads((package[0] / "config.json").read_text())
    config = config.get("text_config", config)
    vocabulary = 2 * config["vocab_size"] * config["hidden_size"] * 4
    assert (out / "mtp.onnx.data").stat().st_size < (out / "model.onnx.data").stat().st_size - vocabulary
    model = json.loads((out / "genai_config.json").read_text())["model"]
    assert model["decoder"]["outputs"]["hidden_states"] == "hidden_states"
    assert model["mtp"]["filename"] == "mtp.onnx" and model["mtp"]["main_hidden_states"] == "hidden_states"
    assert model["mtp"]["outputs"]["hidden_states"] == "hidden_states_out"
    assert "shared_initializers" not in model["decoder"]  # genai 0.18's CPU provider refuses the declaration
    og.Model(str(out))


def _genai_greedy(out, ids):
    import onnxruntime_genai as og

    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=MAX_LENGTH)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(ids, np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(ids):]


def test_speculative_greedy_is_lossless(package):
    # Plain greedy in onnxruntime-genai and in transformers, and speculative greedy with the head's
    # drafts (random weights: almost all rejected, each undone by replay) and with a drafter right two
    # times in three (accepted drafts: two tokens a step), give the same tokens, for prompts shorter
    # than the DeltaNet's conv, longer, and longer than the head's first pass.
    source, out = package
    model = _decoder(source)
    spec = Speculative(out)
    generated = []
    for ids in PROMPTS:
        plain = _genai_greedy(out, ids)
        eos = json.loads((out / "genai_config.json").read_text())["model"]["eos_token_id"]
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_length=MAX_LENGTH, do_sample=False, eos_token_id=eos,
                                  pad_token_id=eos)[0, len(ids):].tolist()
        generated.append(want)
        assert plain == [t for t in want if t != eos]  # genai's sequence ends before the end token
        got, stats = spec.generate(ids, MAX_LENGTH - len(ids))
        assert got == want and stats.drafts > 0 and stats.head_steps == stats.drafts
        calls = iter(range(10**6))
        oracle = lambda tokens: (want + [0])[len(tokens) - len(ids)] + (next(calls) % 3 == 2)  # noqa: E731
        got, stats = spec.generate(ids, MAX_LENGTH - len(ids), drafter=oracle)
        assert got == want
        if len(want) > 6:
            assert 0 < stats.accepted < stats.drafts
            assert stats.forwards < len(want)  # fewer decoder steps than tokens
    assert max(len(t) for t in generated) > 20, "the references stopped too early to prove anything"


def test_sampled_speculation_with_top_k_1_is_greedy(package):
    # Sampling from one candidate is greedy: drafts are kept exactly when they are the argmax.
    _, out = package
    spec = Speculative(out)
    plain, _ = spec.generate(PROMPTS[0], 20, speculate=False)
    got, stats = spec.generate(PROMPTS[0], 20, do_sample=True, top_k=1, seed=0)
    assert got == plain and stats.drafts > 0


def test_sampled_speculation_keeps_the_decoder_distribution(tmp_path_factory):
    # Speculative sampling (a draft d ~ q kept with probability min(1, p(d)/q(d)), else a token drawn
    # from max(0, p - q)) leaves the decoder's distribution of the second token unchanged: its
    # frequencies over 3000 runs against p(t2 | prompt, t1), summed over the first token.
    folder = tmp_path_factory.mktemp("mtp_sampled")
    source = add_mtp_head(make_checkpoint(folder / "src", "Qwen3_5TextConfig", **{**DENSE, "vocab_size": 64,
                                                                                 "eos_token_id": 63}))
    out = build(source, folder / "out", "-p", "fp32")
    spec = Speculative(out)
    prompt = [5, 17, 33]
    s = spec.decoder
    first, states = s.run(prompt, s.empty(), 0, {})
    temperature = 2.0
    p1 = _softmax(first["logits"][0, -1] / temperature)
    p1[63] = 0  # a first token that ends the sequence has no second: those runs are not counted
    p1 /= p1.sum()
    want = np.zeros(64)
    for t1 in range(64):
        step, _ = s.run([t1], states, len(prompt), {})
        want += p1[t1] * _softmax(step["logits"][0, -1] / temperature)
    counts = np.zeros(64)
    runs = 3000
    for seed in range(runs):
        got, _ = spec.generate(prompt, 2, do_sample=True, temperature=temperature, seed=seed)
        if len(got) == 2:
            counts[got[1]] += 1
    freq = counts / counts.sum()
    assert counts.sum() > 0.9 * runs
    # Total variation (the seeds fixed, so the same every run): 0.057 for this sampler; 0.21 for one that
    # keeps every draft (the head's distribution), 0.097 for one that corrects from p instead of max(0, p - q).
    assert 0.5 * np.abs(freq - want).sum() < 0.08, 0.5 * np.abs(freq - want).sum()


def _softmax(z):
    z = z.astype(np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def test_int4_head_is_quantized_like_the_decoder(tmp_path):
    source = VARIANTS["dense"](tmp_path / "src")
    out = build(source, tmp_path / "out", "-p", "int4", "--block-size", "32")
    ops = {n.op_type for n in onnx.load(out / "mtp.onnx", load_external_data=False).graph.node}
    assert "MatMulNBits" in ops
    hidden, _ = _hidden(_decoder(source), PROMPTS[0])
    want, want_hidden = _reference(source)(hidden[:-1], PROMPTS[0][1:], np.arange(len(PROMPTS[0]) - 1))
    got, got_hidden, _ = _head(out, hidden[:-1], PROMPTS[0][1:])

    def cos(a, b):
        return (a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)

    # 4-bit blocks of 32 over tiny random matrices: close to the float head, not equal.
    assert cos(got_hidden, want_hidden) > 0.99, cos(got_hidden, want_hidden)
    assert cos(got, want[-1:]) > 0.98, cos(got, want[-1:])
    Speculative(out).generate(PROMPTS[0], 8)


@pytest.mark.parametrize("flags", [["--no-mtp"], ["--extra_options", "exclude_mtp=true"]])
def test_no_mtp_builds_the_decoder_alone(tmp_path, flags):
    source = VARIANTS["dense"](tmp_path / "src")
    out = build(source, tmp_path / "out", "-p", "fp32", *flags)
    assert not (out / "mtp.onnx").exists()
    assert "mtp" not in json.loads((out / "genai_config.json").read_text())["model"]
    assert "hidden_states" not in {o.name for o in onnx.load(out / "model.onnx", load_external_data=False).graph.output}


@pytest.mark.parametrize("change, named", [
    (dict(drop="mtp.fc.weight"), "mtp.fc.weight"),
    (dict(drop="mtp.layers.0.self_attn.k_proj.weight"), "mtp.layers.0.self_attn.k_proj.weight"),
    (dict(shapes={"mtp.pre_fc_norm_hidden.weight": (32,)}), "mtp.pre_fc_norm_hidden.weight"),
])
def test_an_incomplete_head_is_refused_naming_the_tensor(tmp_path, capsys, change, named):
    folder = tmp_path / "src"
    make_checkpoint(folder, "Qwen3_5TextConfig", **DENSE)
    add_mtp_head(folder, **change)
    capsys.readouterr()
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-p", "fp32"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert named in err[0] and "--no-mtp" in err[0] and len(err) == 1, err
    assert not (tmp_path / "out").exists()
    # Without the head, the decoder builds.
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-q", "-p", "fp32", "--no-mtp"]) == 0


def test_a_head_with_unread_tensors_is_refused(tmp_path, capsys):
    folder = tmp_path / "src"
    make_checkpoint(folder, "Qwen3_5TextConfig", **DENSE)
    add_mtp_head(folder, shapes={"mtp.extra_proj.weight": (4, 4)})
    capsys.readouterr()
    assert main(["-m", str(folder), "-o", str(tmp_path / "out"), "-p", "fp32"]) != 0
    assert "mtp.extra_proj.weight" in capsys.readouterr().err


def test_prune_lm_head_with_a_head_is_refused(tmp_path, capsys):
    source = VARIANTS["dense"](tmp_path / "src")
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", "fp32", "--prune-lm-head"]) != 0
    assert "--no-mtp" in capsys.readouterr().err


def test_head_equals_the_reference_builders(tmp_path):
    # onnxruntime-genai 0.18's own builder (builders/qwen.py, Qwen35Model) writes the same head from the
    # hub's layout: both mtp.onnx files on identical inputs (a prompt's pairs, then two more over the
    # cache). Its CPU head cannot run as written: position_ids is declared [3, batch, sequence] (M-RoPE
    # rows) and fed straight to RotaryEmbedding, which takes two dimensions; redeclared [batch, sequence]
    # here. Its package also declares shared_initializers, which og.Model refuses on the CPU ("GetMemoryInfo
    # for CPU should not be used"); ours opens (test_package_stores_the_vocabulary_once).
    import subprocess
    import sys

    source = _conditional(tmp_path / "src")
    ours = build(source, tmp_path / "ours", "-p", "fp32")
    ref = tmp_path / "ref"
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(ref),
                           "-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "cache")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    head = onnx.load(ref / "mtp.onnx", load_external_data=False)
    position_ids = next(i for i in head.graph.input if i.name == "position_ids")
    del position_ids.type.tensor_type.shape.dim[0]
    onnx.save(head, ref / "mtp.onnx")
    hidden, _ = _hidden(_decoder(source), PROMPTS[2])
    ids = PROMPTS[2]
    cut = len(ids) - 3

    def run(folder, rows, tokens, past, length):
        session = ort.InferenceSession(str(folder / "mtp.onnx"), providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feed = {"input_ids": np.asarray([tokens], np.int64),
                "attention_mask": np.ones((1, length + len(tokens)), np.int64),
                "hidden_states": np.asarray(rows, np.float32)[None], **past}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(length, length + len(tokens))[None]
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        return out, {f"past_key_values.0.{k}": out[f"present.0.{k}"] for k in ("key", "value")}

    for folder in (ours, ref):
        empty = {f"past_key_values.0.{k}": np.zeros((1, 1, 0, 64), np.float32) for k in ("key", "value")}
        first, past = run(folder, hidden[:cut], ids[1:cut + 1], empty, 0)
        second, _ = run(folder, hidden[cut:-1], ids[cut + 1:], past, cut)
        if folder == ours:
            want = first, second
            continue
        for got, mine in zip((first, second), want):
            got["logits"] = got["logits"][:, -1:]  # ours: the last position's
            for name in ("logits", "hidden_states_out"):
                assert relative_error(mine[name], got[name]) < 1e-4, (name, relative_error(mine[name], got[name]))


@pytest.mark.parametrize("variant, precision", [("dense", "fp32"), ("deepseek_v3", "fp32"), ("moe", "int4")])
def test_verify_compares_the_head_and_reports_its_acceptance(tmp_path, capsys, variant, precision):
    # --verify compares the head's last logits after the prompt with its math in transformers' modules
    # (rounded as an int4 build rounds it) and reports builder.speculative's draft acceptance.
    source = VARIANTS[variant](tmp_path / "src")
    capsys.readouterr()
    # (int4 at --accuracy-level 0: the decoder's own verdict at level 4's int8 activations misses this
    # tiny MoE's tolerance, with or without the head)
    levels = ["--accuracy-level", "0"] if precision == "int4" else []
    assert main(["-m", str(source), "-o", str(tmp_path / "out"), "-p", precision, "--verify", *levels]) == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "the MTP head" in line)
    assert "draft acceptance" in line and "PASS" in line.upper(), line


def test_head_at_its_own_precision(tmp_path, capsys):
    # --mtp-precision fp32 beside an int4 decoder: the head's projection and layer stay float (its
    # hidden_states_out equals the float head's math), its lm_head is still the decoder's 4-bit one.
    source = VARIANTS["dense"](tmp_path / "src")
    out = build(source, tmp_path / "out", "-p", "int4", "--mtp-precision", "fp32")
    nbits = [n for n in onnx.load(out / "mtp.onnx", load_external_data=False).graph.node if n.op_type == "MatMulNBits"]
    assert [n.name for n in nbits] and all("lm_head" in n.name for n in nbits)
    hidden, _ = _hidden(_decoder(source), PROMPTS[0])
    _, want = _reference(source)(hidden[:-1], PROMPTS[0][1:], np.arange(len(PROMPTS[0]) - 1))
    _, got, _ = _head(out, hidden[:-1], PROMPTS[0][1:])
    assert relative_error(got, want) < 1e-4
    capsys.readouterr()
    assert main(["-m", str(source), "-o", str(tmp_path / "fp16"), "-p", "int4", "--mtp-precision", "fp16"]) != 0
    assert "--mtp-precision fp16" in capsys.readouterr().err
