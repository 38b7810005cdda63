"""What Qwen3.5's MTP head buys on this CPU: the cost of a draft step, of verifying [token, draft] in one
decoder step and of one plain decode step, at a full-size shape, and the decode speed of
builder.speculative at a chosen draft acceptance rate against its own plain decoding.

    python scripts/make_synthetic_checkpoint.py Qwen3.5-2B /tmp/mtp/src
    python -m builder -i /tmp/mtp/src -o /tmp/mtp/int4 -p int4 --overwrite
    python scripts/mtp_speed.py /tmp/mtp/int4 --threads 2 --acceptance 0.8

Random weights accept no drafts, so the runs at a given acceptance draft with an oracle (the plain
greedy tokens, wrong on a fixed share of the steps) and pay for the head's step as measured. A round
commits 1 + a tokens on average for one head step and one decoder step over the kept tokens and
the draft (a rejected draft's right token rides in the next round's step: no step of its own), so
the speedup is about (1 + a) · decode / (head + a · verify₂ + (1 − a) · verify₃) (a step after a
rejected draft carries one token more), which the runs confirm.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from builder.speculative import HIDDEN, Speculative


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    ap.add_argument("--acceptance", type=float, nargs="+", default=[0.6, 0.8, 0.9])
    ap.add_argument("--repeat", type=int, default=15, help="repeats of each step timing")
    ap.add_argument("--runs", type=int, default=3, help="interleaved generations per acceptance rate")
    args = ap.parse_args()

    spec = Speculative(args.folder, threads=args.threads)
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 1000, args.context).tolist()
    d, h = spec.decoder, spec.head
    out, states = d.run(prompt, d.empty(), 0, {})
    hidden = out[HIDDEN][0]
    head_out, head_states = h.run(prompt[1:], h.empty(), 0, {HIDDEN: hidden[:-1][None].astype(h.dtype)})
    n = len(prompt)
    decode = best(lambda: d.run([5], states, n, {}), args.repeat)
    verify = best(lambda: d.run([5, 6], states, n, {}), args.repeat)
    head = best(lambda: h.run([5], head_states, n - 1, {HIDDEN: hidden[-1:][None].astype(h.dtype)}), args.repeat)
    print(f"{args.folder.name}, {args.threads} threads, {n} tokens of context")
    print(f"decode step (1 token)      {decode * 1e3:7.1f} ms")
    print(f"verify step (2 tokens)     {verify * 1e3:7.1f} ms  ({verify / decode:.2f}x a decode step)")
    print(f"head step (1 draft)        {head * 1e3:7.1f} ms  ({head / decode:.2f}x)")
    verify3 = best(lambda: d.run([5, 6, 7], states, n, {}), args.repeat)
    print(f"verify step (3 tokens)     {verify3 * 1e3:7.1f} ms  ({verify3 / decode:.2f}x)")
    for a in args.acceptance:
        # after an accepted draft the step carries [token, draft], after a rejected one a token more
        print(f"predicted at acceptance {a:.0%}: {(1 + a) * decode / (head + a * verify + (1 - a) * verify3):.2f}x")

    plain, base = spec.generate(prompt, args.tokens, speculate=False)
    genai = genai_speed(args.folder, prompt, args.tokens, args.threads)
    print(f"plain decoding: this runner {base.tokens_per_second:.1f} tok/s, onnxruntime-genai's og.Generator "
          f"{genai:.1f} tok/s")
    for a in args.acceptance:
        ratios, rates, kept = [], [], []
        for _ in range(args.runs):  # interleaved with plain runs: a busy machine slows both alike
            _, base = spec.generate(prompt, args.tokens, speculate=False)
            oracle = Oracle(spec, prompt, a)
            _, stats = spec.generate(prompt, args.tokens, drafter=oracle)
            seconds = stats.decode_seconds - oracle.seconds + stats.drafts * head
            ratios.append(base.decode_seconds / seconds)
            rates.append(stats.tokens / seconds)
            kept.append(stats.acceptance)
        print(f"measured at acceptance {np.median(kept):.0%}: {np.median(rates):5.1f} tok/s, "
              f"{np.median(ratios):.2f}x plain (median of {args.runs}: {', '.join(f'{r:.2f}' for r in ratios)}), "
              f"{np.median(rates) / genai:.2f}x og.Generator's")


def genai_speed(folder: Path, prompt: list[int], tokens: int, threads: int) -> float:
    """onnxruntime-genai's plain greedy decoding of the same package: tokens a second after the prompt."""
    import json

    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + tokens, min_length=len(prompt) + tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, np.int32))
    started = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    return (len(generator.get_sequence(0)) - len(prompt)) / (time.perf_counter() - started)


class Oracle:
    """Drafts the decoder's own next token (from a plain decoding of its own, kept in step with the
    committed tokens), wrong on a `1 - acceptance` share of the drafts (the right token + 1, drawn
    by a seeded coin); `seconds`: its own time, which the measurement leaves out (the head's step,
    measured apart, is counted instead)."""

    def __init__(self, spec: Speculative, prompt: list[int], acceptance: float):
        self.decoder, self.acceptance = spec.decoder, acceptance
        self.rng = np.random.default_rng(1)
        out, self.states = self.decoder.run(prompt, self.decoder.empty(), 0, {})
        self.seen, self.next = len(prompt), int(np.argmax(out["logits"][0, -1]))
        self.seconds = 0.0  # from the first draft on, as the decode's own time

    def __call__(self, tokens: list[int]) -> int:
        started = time.perf_counter()
        if len(tokens) > self.seen:
            out, self.states = self.decoder.run(tokens[self.seen:], self.states, self.seen, {})
            self.seen, self.next = len(tokens), int(np.argmax(out["logits"][0, -1]))
        draft = self.next if self.rng.random() < self.acceptance else self.next + 1
        self.seconds += time.perf_counter() - started
        return draft


if __name__ == "__main__":
    main()
