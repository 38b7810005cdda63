"""A tiny Qwen3.5 (gated DeltaNet and gated attention) with a trained MTP head, for the draft acceptance
a trained head reaches: a byte-level model trained on this repository's own text for a few minutes
of torch on the CPU, its head trained beside it (the MTP loss: the token after next, from the
decoder's last hidden state and the next token's embedding), saved with the head in the hub's names
(mtp.*), built by builder, and decoded with builder.speculative on held-out text.

    python scripts/train_tiny_mtp.py /tmp/tiny-mtp --minutes 4

Prints the held-out next-token and head accuracies, then builder.speculative's greedy acceptance and
its decoder steps per token on 16 held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(
    vocab_size=256, hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=48, max_position_embeddings=1024, linear_conv_kernel_dim=4,
    linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=4, linear_num_value_heads=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    tie_word_embeddings=True, eos_token_id=0, bos_token_id=None, pad_token_id=0,
)


def corpus() -> np.ndarray:
    """This repository's Python and Markdown as bytes (no NUL: 0 is the end token)."""
    files = sorted([*ROOT.glob("builder/**/*.py"), *ROOT.glob("architectures/*.py"), *ROOT.glob("docs/*.md"),
                    ROOT / "README.md"])
    data = b"\n".join(f.read_bytes() for f in files).replace(b"\0", b"")
    return np.frombuffer(data, np.uint8).astype(np.int64)


class Head(torch.nn.Module):
    """Qwen3.5's MTP head in the hub's module names (mtp.*): fc(concat(norm_e(embed(t)), norm_h(h)))
    -> a full-attention decoder layer -> norm; the decoder's embedding and lm_head."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        c = transformers.Qwen3_5TextConfig(**{**CONFIG, "num_hidden_layers": 1, "layer_types": ["full_attention"]})
        c._attn_implementation = "sdpa"
        H = config.hidden_size
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.layers = torch.nn.ModuleList([Qwen3_5DecoderLayer(c, layer_idx=0)])
        self.norm = Qwen3_5RMSNorm(H, eps=config.rms_norm_eps)

    def forward(self, model, hidden, next_ids, positions, mask):
        e = model.get_input_embeddings()(next_ids)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)], dim=-1))
        cos, sin = model.model.rotary_emb(x, positions)
        y = self.layers[0](x, position_embeddings=(cos, sin), attention_mask=mask, position_ids=positions)
        y = y[0] if isinstance(y, tuple) else y
        return model.lm_head(self.norm(y))


def batches(data: np.ndarray, length: int, size: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - length - 1, size)
        yield torch.from_numpy(np.stack([data[s:s + length] for s in starts]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    data = corpus()
    split = int(0.95 * len(data))
    train, held = data[:split], data[split:]
    config = transformers.Qwen3_5TextConfig(**CONFIG)
    config._attn_implementation = "sdpa"
    model = transformers.Qwen3_5ForCausalLM(config)
    head = Head(config)
    params = [*model.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    L = args.length
    mask = torch.full((1, 1, L - 1, L - 1), float("-inf")).triu(1)
    positions = torch.arange(L - 1)[None]
    rng = np.random.default_rng(0)
    started, step = time.perf_counter(), 0
    for x in batches(train, L, args.batch, rng):
        out = model(x, output_hidden_states=True)
        lm = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
        hidden = out.hidden_states[-1][:, :-1]  # h_i for i < L - 1, paired with t_{i+1}
        drafts = head(model, hidden, x[:, 1:], positions, mask)  # predicts t_{i+2}
        mtp = torch.nn.functional.cross_entropy(drafts[:, :-1].reshape(-1, 256), x[:, 2:].reshape(-1))
        loss = lm + mtp
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step}: lm {lm.item():.3f}, mtp {mtp.item():.3f}", flush=True)
        if time.perf_counter() - started > 60 * args.minutes:
            break
    model.eval()
    head.eval()
    with torch.no_grad():  # teacher-forced on held-out text: the decoder's next token, the head's the one after
        hits = [0, 0, 0]
        for x in (torch.from_numpy(held[s:s + L][None]) for s in range(0, len(held) - L, L)):
            out = model(x, output_hidden_states=True)
            drafts = head(model, out.hidden_states[-1][:, :-1], x[:, 1:], positions, mask)
            hits[0] += (out.logits[0, :-1].argmax(-1) == x[0, 1:]).sum().item()
            hits[1] += (drafts[0, :-1].argmax(-1) == x[0, 2:]).sum().item()
            hits[2] += L - 2
    print(f"held-out ({len(held)} bytes): next-token accuracy {hits[0] / hits[2]:.1%}, "
          f"head (token after next) {hits[1] / hits[2]:.1%}")
    src = args.folder / "src"
    model.save_pretrained(src)
    tensors = load_file(src / "model.safetensors")
    tensors |= {f"mtp.{k}": v.detach().contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((src / "config.json").read_text())
    raw["mtp_num_hidden_layers"] = 1
    (src / "config.json").write_text(json.dumps(raw, indent=2))
    print(f"trained {step} steps in {time.perf_counter() - started:.0f} s")

    from builder.cli import main as build
    from builder.speculative import Speculative

    out = args.folder / "out"
    assert build(["-i", str(src), "-o", str(out), "-p", "fp32", "--overwrite", "-q"]) == 0
    spec = Speculative(out, threads=2)
    prng = np.random.default_rng(1)
    drafts = accepted = forwards = tokens = 0
    for start in prng.integers(0, len(held) - 200, 16):
        prompt = [int(t) or 32 for t in held[start:start + 64]]
        got, stats = spec.generate(prompt, 64)
        plain, _ = spec.generate(prompt, 64, speculate=False)
        assert got == plain, "speculative greedy differs from plain greedy"
        drafts, accepted = drafts + stats.drafts, accepted + stats.accepted
        forwards, tokens = forwards + stats.forwards - 1, tokens + stats.tokens
    print(f"greedy acceptance {accepted / drafts:.1%} ({accepted} of {drafts} drafts), "
          f"{forwards / tokens:.2f} decoder steps a token (plain: 1.00), 16 held-out prompts of 64 bytes, 64 tokens each")


if __name__ == "__main__":
    sys.exit(main())
