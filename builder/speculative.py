"""Speculative decoding with a package's multi-token-prediction head (mtp.onnx), on any provider.

    from builder.speculative import Speculative
    spec = Speculative("Qwen3.5-2B-int4-cpu")
    tokens, stats = spec.generate(prompt_ids, max_new_tokens=128)   # greedy; do_sample=True samples

Each round the head drafts one token from the decoder's last hidden state and the token just
chosen; the decoder verifies [token, draft] in one step; an accepted draft yields two tokens (and the
third one the verify step predicts) for one decoder step. Greedy output is the decoder's own greedy
output (a draft is kept only when it is the decoder's argmax); sampled output follows the decoder's
distribution exactly (speculative sampling: a draft d drawn from the head's q is kept with
probability min(1, p(d)/q(d)), else the token is drawn from max(0, p − q), renormalized).

Why not onnxruntime-genai (0.18, measured on this package with its CPU provider): `og.MtpGenerator`
stops at its first step when the logits are float32 ("Cast - input and output types are the same":
its host argmax casts the logits to float32 unconditionally), and with float16 logits at the first
rejected draft of a hybrid decoder ("ConvKeyValueCache does not support RewindTo"), as does
`og.Generator.rewind_to` after `snapshot_state` — a Qwen3.5 decoder's convolution and recurrent
states cannot be taken back there; ONNX Runtime's CPU LinearAttention refuses `state_window` (the
per-token states that would) ("CUDA EP only", 1.32). Here the two models run in ONNX Runtime
sessions and every state is an array this runner keeps. A rejected draft costs no step of its own:
the states before the verify step are kept (held, not copied), the right token joins the kept
tokens, and the next verify step runs them with its draft ([token, right, draft], from those
states); after MAX_KEPT rejections in a row a plain step over the kept tokens catches up.

The head's cache covers the whole sequence, as the head was trained (the pair (h_i, t_{i+1}) at
position i, the prompt's included), not only the generated tokens. Batch 1.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Speculative", "Stats"]

HIDDEN, HIDDEN_OUT = "hidden_states", "hidden_states_out"
# Committed tokens a verify step may carry beyond its draft (each rejected draft adds one) before a
# plain step over them alone catches the states up.
MAX_KEPT = 4


@dataclass
class Stats:
    """What a generation did: decoder steps (`forwards`, replays included), drafts proposed and
    kept, the head's steps, and the wall time of the decode (the prompt's step excluded)."""

    forwards: int = 0
    drafts: int = 0
    accepted: int = 0
    head_steps: int = 0
    tokens: int = 0
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**self.__dict__, "acceptance": self.acceptance, "tokens_per_second": self.tokens_per_second}


class _Session:
    """One model of the package in an ONNX Runtime session, its states as arrays: `run(ids,
    extra)` steps it over `ids` from `states` and returns (outputs by name, the states after)."""

    def __init__(self, path: Path, providers: list[str], threads: int | None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.past = [n for n in self.inputs if n.startswith("past")]
        self.dtype = np.float16 if "float16" in self.inputs[self.past[0]].type else np.float32

    def empty(self) -> dict[str, np.ndarray]:
        """Every state before the first token: KV caches of length 0, conv and recurrent states of zeros."""
        states = {}
        for name in self.past:
            dims = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in self.inputs[name].shape]
            states[name] = np.zeros(dims, self.dtype)
        return states

    def run(self, ids: list[int], states: dict[str, np.ndarray], length: int, extra: dict[str, np.ndarray]
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """`ids` appended after `length` tokens (the states' length)."""
        total = length + len(ids)
        feed = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, total), np.int64),
                **states, **extra}
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(length, total, dtype=np.int64)[None]
        values = dict(zip(self.outputs, self.session.run(None, feed)))
        after = {name: values[_present(name)] for name in self.past}
        return values, after


def _present(past: str) -> str:
    """The output that carries input `past` forward: past_key_values.N.key -> present.N.key,
    past.N.conv -> present.N.conv."""
    return past.replace("past_key_values.", "present.") if past.startswith("past_key_values.") else \
        past.replace("past.", "present.", 1)


@dataclass
class _Sampler:
    """Greedy, or sampling with temperature, top-k and top-p, as onnxruntime-genai's search does."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64) / max(self.temperature, 1e-6)
        if self.top_k and self.top_k < len(z):
            z[z < np.partition(z, -self.top_k)[-self.top_k]] = -np.inf
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p)
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), self.top_p)) + 1]
            kept = np.zeros_like(p)
            kept[keep] = p[keep]
            p = kept / kept.sum()
        return p

    def pick(self, logits: np.ndarray) -> int:
        if not self.do_sample:
            return int(np.argmax(logits))
        p = self.probabilities(logits)
        return int(self.rng.choice(len(p), p=p))


class Speculative:
    """A built folder's decoder (model.onnx, with its hidden_states output) and draft head
    (mtp.onnx), as genai_config.json's `mtp` section names them, run in ONNX Runtime sessions on
    `providers` with `threads` intra-op threads (None: ONNX Runtime's default)."""

    def __init__(self, folder: str | Path, providers: list[str] | None = None, threads: int | None = None):
        folder = Path(folder)
        config = json.loads((folder / "genai_config.json").read_text())
        model = config["model"]
        if "mtp" not in model:
            raise ValueError(f"{folder} has no draft head (genai_config.json has no 'mtp' section): build it "
                             "from a checkpoint with an MTP head, without --no-mtp")
        providers = providers or ["CPUExecutionProvider"]
        self.decoder = _Session(folder / model["decoder"]["filename"], providers, threads)
        self.head = _Session(folder / model["mtp"]["filename"], providers, threads)
        if HIDDEN not in self.decoder.outputs:
            raise ValueError(f"{folder}/model.onnx has no {HIDDEN} output for its draft head")
        eos = model.get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.max_length = int(config.get("search", {}).get("max_length") or model.get("context_length"))

    def generate(self, prompt: list[int], max_new_tokens: int, *, speculate: bool = True, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 drafter: Any = None) -> tuple[list[int], Stats]:
        """Up to `max_new_tokens` tokens after `prompt` (stopping after an end-of-sequence token or
        at the context length), and what it took. `speculate` False: plain decoding, one decoder
        step a token, on the same sessions (the baseline). `drafter(tokens) -> token` proposes the
        drafts instead of the head (prompt lookup, a test's oracle)."""
        sampler = _Sampler(do_sample, temperature, top_k, top_p, np.random.default_rng(seed))
        stats = Stats()
        context = self.max_length
        limit = min(max_new_tokens, context - len(prompt))
        tokens, generated = list(prompt), []
        started = time.perf_counter()
        out, states = self.decoder.run(list(prompt), self.decoder.empty(), 0, {})
        stats.forwards += 1
        stats.prefill_seconds = time.perf_counter() - started
        started = time.perf_counter()
        vocab = out["logits"].shape[-1]
        hidden = out[HIDDEN][0]
        # The invariant: `states` hold the decoder's first `base` tokens; `kept` are the committed
        # tokens after them (at least one), not yet in the states; `pairs` what the head has not seen.
        base, kept = len(prompt), []
        pairs = [(hidden[i], prompt[i + 1]) for i in range(len(prompt) - 1)]
        head_states, head_length = self.head.empty(), 0

        def commit(token: int, h: np.ndarray) -> bool:
            """Commits `token` (whose hidden-state pair for the head is `h`, the position before's);
            True when generation ends with it."""
            generated.append(token)
            tokens.append(token)
            kept.append(token)
            pairs.append((h, token))
            return token in self.eos or len(generated) >= limit

        done = limit <= 0 or commit(sampler.pick(out["logits"][0, -1]), hidden[-1])
        while not done:
            n = len(kept)
            if not speculate or n > MAX_KEPT or base + n + 1 > context:
                # The kept tokens alone (plain decoding, or after a run of rejected drafts): the states
                # catch up and the last row gives the next token.
                out, states = self.decoder.run(kept, states, base, {})
                stats.forwards += 1
                base, kept[:] = base + n, []
                done = commit(sampler.pick(out["logits"][0, -1]), out[HIDDEN][0, -1])
                continue
            # 1. A draft of the token after the last kept one: the head's, from the pairs it has not seen.
            if drafter is not None:
                draft = int(drafter(tokens))
                q = np.eye(1, vocab, draft)[0] if do_sample else None  # a drafter's certainty
            else:
                hs = np.stack([h for h, _ in pairs])[None].astype(self.head.dtype)
                head_out, head_states = self.head.run([t for _, t in pairs], head_states, head_length, {HIDDEN: hs})
                stats.head_steps += 1
                head_length += len(pairs)
                logits = head_out["logits"][0, -1]
                q = sampler.probabilities(logits) if do_sample else None
                draft = int(sampler.rng.choice(vocab, p=q)) if do_sample else int(np.argmax(logits))
            pairs.clear()
            # 2. The decoder steps over the kept tokens and the draft from its states: row n - 1 says
            # what follows the last kept token, row n what follows the draft.
            out, verified = self.decoder.run([*kept, draft], states, base, {})
            stats.forwards += 1
            stats.drafts += 1
            rows, hs = out["logits"][0], out[HIDDEN][0]
            if do_sample:  # kept with probability min(1, p/q); else drawn from max(0, p - q)
                p = sampler.probabilities(rows[n - 1])
                accepted = sampler.rng.random() * q[draft] < p[draft]
                residual = np.maximum(p - q, 0)
                correction = None if accepted else int(sampler.rng.choice(vocab, p=residual / residual.sum()))
            else:
                correction = int(np.argmax(rows[n - 1]))
                accepted = correction == draft
            if accepted:  # every kept token and the draft are in the states now
                stats.accepted += 1
                states, base, kept[:] = verified, base + n + 1, []
                done = commit(draft, hs[n - 1]) or commit(sampler.pick(rows[n]), hs[n])
                kept[:] = kept[-1:]  # the token after the draft: not in the states yet
            else:
                # Rejected: the states stay where they were (the step's are dropped: a hybrid's
                # recurrent states cannot be cut back), the right token joins the kept ones, and
                # the next step runs them again with the next draft.
                done = commit(correction, hs[n - 1])
        stats.decode_seconds = time.perf_counter() - started
        stats.tokens = len(generated)
        return generated, stats
