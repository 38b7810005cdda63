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

HIDDEN = "hidden_states"  # the decoder's output and the head's input (genai_config.json's mtp section)
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


@dataclass(frozen=True)
class _States:
    """One generation's states in buffers of its own: each KV cache `capacity` positions long, written
    in place (GroupQueryAttention's shared past and present buffer: a step from these states writes
    past their length only), and two sets of the other states (convolution, recurrent), `side` the
    one a step reads (it writes the other, so the states before a step stay as they were)."""

    kv: dict[str, Any]
    sets: tuple[dict[str, Any], dict[str, Any]]
    side: int = 0

    def after(self) -> _States:
        return _States(self.kv, self.sets, 1 - self.side)


class _Session:
    """One model of the package in an ONNX Runtime session: `run(ids, states, length, extra)` steps
    it over `ids` after the `length` tokens `states` hold and returns (its other outputs by name,
    the states after), every state bound in place (no copies, no allocation a step)."""

    def __init__(self, path: Path, providers: list[str], threads: int | None, context: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.past = [n for n in self.inputs if n.startswith("past")]
        self.fresh = [n for n in self.outputs if not n.startswith("present")]  # logits, hidden states
        self.dtype = np.float16 if "float16" in self.inputs[self.past[0]].type else np.float32
        self.context = context

    def empty(self, capacity: int | None = None) -> _States:
        """Every state before the first token, for up to `capacity` tokens (default: the context, at
        most 4096): KV caches of zeros that many positions long, conv and recurrent states of zeros."""
        from onnxruntime import OrtValue

        capacity = capacity or min(self.context, 4096)
        kv, sets = {}, ({}, {})
        for name in self.past:
            dims = [1 if d == "batch_size" else capacity if isinstance(d, str) else d for d in self.inputs[name].shape]
            if name.startswith("past_key_values."):
                kv[name] = OrtValue.ortvalue_from_numpy(np.zeros(dims, self.dtype))
            else:
                for side in sets:
                    side[name] = OrtValue.ortvalue_from_numpy(np.zeros(dims, self.dtype))
        return _States(kv, sets)

    def run(self, ids: list[int], states: _States, length: int, extra: dict[str, np.ndarray]
            ) -> tuple[dict[str, np.ndarray], _States]:
        """`ids` appended after `length` tokens (the states' length)."""
        total = length + len(ids)
        bind = self.session.io_binding()
        bind.bind_cpu_input("input_ids", np.asarray([ids], np.int64))
        bind.bind_cpu_input("attention_mask", np.ones((1, total), np.int64))
        if "position_ids" in self.inputs:
            bind.bind_cpu_input("position_ids", np.arange(length, total, dtype=np.int64)[None])
        for name, value in extra.items():
            bind.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self.fresh:
            bind.bind_output(name, "cpu")
        for name in self.past:
            if name in states.kv:
                bind.bind_ortvalue_input(name, states.kv[name])
                bind.bind_ortvalue_output(_present(name), states.kv[name])
            else:
                bind.bind_ortvalue_input(name, states.sets[states.side][name])
                bind.bind_ortvalue_output(_present(name), states.sets[1 - states.side][name])
        self.session.run_with_iobinding(bind)
        values = {name: value.numpy() for name, value in zip(self.fresh, bind.get_outputs())}
        return values, states.after()


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

    def judge(self, logits: np.ndarray, draft: int, q: np.ndarray | None) -> tuple[bool, int | None]:
        """Whether `draft` (drawn from `q`; greedy: None) is kept where the decoder's `logits` say
        what comes, and the token in its place when it is not: greedy, the argmax; sampling, kept
        with probability min(1, p/q), else drawn from max(0, p - q), renormalized."""
        if not self.do_sample:
            right = int(np.argmax(logits))
            return right == draft, right
        p = self.probabilities(logits)
        if self.rng.random() * q[draft] < p[draft]:
            return True, None
        residual = np.maximum(p - q, 0)
        return False, int(self.rng.choice(len(p), p=residual / residual.sum()))


class _Drafts:
    """The head's side of a generation: its session, its states and how many pairs they hold."""

    def __init__(self, session: _Session, states: _States):
        self.session, self.states, self.length = session, states, 0

    def draft(self, pairs: list[tuple[np.ndarray, int]], sampler: _Sampler, stats: Stats
              ) -> tuple[int, np.ndarray | None]:
        """The head stepped over the `pairs` (h_i, t_{i+1}) it has not seen: its draft of the token
        after the last, and the distribution it was drawn from (greedy: None)."""
        hidden = np.stack([h for h, _ in pairs])[None].astype(self.session.dtype)
        out, self.states = self.session.run([t for _, t in pairs], self.states, self.length, {HIDDEN: hidden})
        stats.head_steps += 1
        self.length += len(pairs)
        logits = out["logits"][0, -1]
        if not sampler.do_sample:
            return int(np.argmax(logits)), None
        q = sampler.probabilities(logits)
        return int(sampler.rng.choice(len(q), p=q)), q


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
        eos = model.get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.max_length = int(config.get("search", {}).get("max_length") or model.get("context_length"))
        self.decoder = _Session(folder / model["decoder"]["filename"], providers, threads, self.max_length)
        self.head = _Session(folder / model["mtp"]["filename"], providers, threads, self.max_length)
        if HIDDEN not in self.decoder.outputs:
            raise ValueError(f"{folder}/model.onnx has no {HIDDEN} output for its draft head")

    def generate(self, prompt: list[int], max_new_tokens: int, *, speculate: bool = True, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 drafter: Any = None) -> tuple[list[int], Stats]:
        """Up to `max_new_tokens` tokens after `prompt` (stopping after an end-of-sequence token or
        at the context length), and what it took. `speculate` False: plain decoding, one decoder
        step a token, on the same sessions (the baseline). `drafter(tokens) -> token` proposes the
        drafts instead of the head (prompt lookup, a test's oracle)."""
        sampler = _Sampler(do_sample, temperature, top_k, top_p, np.random.default_rng(seed))
        limit = min(max_new_tokens, self.max_length - len(prompt))
        run = _Generation(self, prompt, limit, sampler)
        done = limit <= 0 or run.prefill()
        started = time.perf_counter()
        while not done:
            n = len(run.kept)
            if not speculate or n > MAX_KEPT or run.base + n + 1 > self.max_length:
                done = run.catch_up()  # plain decoding, or after a run of rejected drafts
                continue
            # 1. A draft of the token after the last kept one: the head's, from the pairs it has not seen.
            if drafter is not None:
                draft = int(drafter(run.tokens))
                q = np.eye(1, run.vocab, draft)[0] if do_sample else None  # a drafter's certainty
            else:
                draft, q = run.head.draft(run.pairs, sampler, run.stats)
            run.pairs.clear()
            done = run.verify(draft, q)
        run.stats.decode_seconds = time.perf_counter() - started
        run.stats.tokens = len(run.generated)
        return run.generated, run.stats


class _Generation:
    """One generation's state. The invariant: `states` hold the decoder's first `base` tokens;
    `kept` are the committed tokens after them (at least one once started), not yet in the states;
    `pairs` the (h_i, t_{i+1}) the head has not seen."""

    def __init__(self, spec: Speculative, prompt: list[int], limit: int, sampler: _Sampler):
        self.spec, self.limit, self.sampler = spec, limit, sampler
        self.tokens, self.generated, self.kept = list(prompt), [], []
        self.stats = Stats()
        capacity = min(spec.max_length, len(prompt) + max(limit, 0) + MAX_KEPT + 2)
        self.states, self.base = spec.decoder.empty(capacity), 0
        self.head = _Drafts(spec.head, spec.head.empty(capacity))
        self.pairs: list[tuple[np.ndarray, int]] = []
        self.vocab = 0

    def commit(self, token: int, h: np.ndarray) -> bool:
        """Commits `token` (`h`: the hidden state of the position before, its pair for the head);
        True when the generation ends with it."""
        self.generated.append(token)
        self.tokens.append(token)
        self.kept.append(token)
        self.pairs.append((h, token))
        return token in self.spec.eos or len(self.generated) >= self.limit

    def prefill(self) -> bool:
        """The prompt's step and its next token."""
        started = time.perf_counter()
        prompt = list(self.tokens)
        out, self.states = self.spec.decoder.run(prompt, self.states, 0, {})
        self.stats.forwards += 1
        self.stats.prefill_seconds = time.perf_counter() - started
        self.base, self.vocab = len(prompt), out["logits"].shape[-1]
        hidden = out[HIDDEN][0]
        self.pairs = [(hidden[i], prompt[i + 1]) for i in range(len(prompt) - 1)]
        return self.commit(self.sampler.pick(out["logits"][0, -1]), hidden[-1])

    def catch_up(self) -> bool:
        """A step over the kept tokens alone: the states catch up, the last row gives the next token."""
        out, self.states = self.spec.decoder.run(self.kept, self.states, self.base, {})
        self.stats.forwards += 1
        self.base, self.kept[:] = self.base + len(self.kept), []
        return self.commit(self.sampler.pick(out["logits"][0, -1]), out[HIDDEN][0, -1])

    def verify(self, draft: int, q: np.ndarray | None) -> bool:
        """The decoder's step over the kept tokens and `draft` from its states: row n - 1 says what
        follows the last kept token (the draft kept or not), row n what follows the draft."""
        n = len(self.kept)
        out, verified = self.spec.decoder.run([*self.kept, draft], self.states, self.base, {})
        self.stats.forwards += 1
        self.stats.drafts += 1
        rows, hs = out["logits"][0], out[HIDDEN][0]
        accepted, correction = self.sampler.judge(rows[n - 1], draft, q)
        if not accepted:
            # The states stay where they were (the step's are dropped: a hybrid's recurrent states
            # cannot be cut back); the right token joins the kept ones, and the next step runs them
            # again with the next draft.
            return self.commit(correction, hs[n - 1])
        self.stats.accepted += 1  # every kept token and the draft are in the states now
        self.states, self.base, self.kept[:] = verified, self.base + n + 1, []
        done = self.commit(draft, hs[n - 1]) or self.commit(self.sampler.pick(rows[n]), hs[n])
        self.kept[:] = self.kept[-1:]  # the token after the draft: not in the states yet
        return done
