"""What Qwen3.5's MTP head buys on this CPU: the cost of a draft step, of verifying [token, draft] in one
decoder step and of one plain decode step, at a full-size shape, and the decode speed of
builder.speculative at a chosen draft acceptance rate against its own plain decoding.

    python scripts/make_synthetic_checkpoint.py Qwen3.5-2B /tmp/mtp/src
    python -m builder -i /tmp/mtp/src -o /tmp/mtp/int4 -p int4 --overwrite
    python scripts/mtp_speed.py /tmp/mtp/int4 --threads 2 --acceptance 0.8

Random weights accept no drafts, so the runs at a given acceptance draft with an oracle (the plain
greedy tokens, wrong on a fixed share of the steps) and pay for the head's step as measured. The
speedup of a hybrid decoder (a rejected draft costs a replay of one token) is then
(1 + a) · decode / (head + verify + (1 − a) · decode) per committed token, which the runs confirm.
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
    ap.add_argument("--repeat", type=int, default=9)
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
    for a in args.acceptance:
        print(f"predicted at acceptance {a:.0%}: {(1 + a) * decode / (head + verify + (1 - a) * decode):.2f}x")

    plain, base = spec.generate(prompt, args.tokens, speculate=False)
    for a in args.acceptance:
        calls = iter(range(10**9))
        period = round(1 / (1 - a)) if a < 1 else 10**9  # wrong once every `period` drafts

        def oracle(tokens, calls=calls, period=period):
            k = len(tokens) - len(prompt)
            right = plain[k] if k < len(plain) else 0
            return right if (next(calls) + 1) % period else right + 1

        got, stats = spec.generate(prompt, args.tokens, drafter=oracle)
        assert got == plain
        seconds = stats.decode_seconds + stats.drafts * head
        print(f"measured at acceptance {stats.acceptance:.0%}: {stats.tokens / seconds:6.1f} tok/s against "
              f"{base.tokens_per_second:6.1f} plain: {base.decode_seconds / seconds:.2f}x "
              f"({stats.forwards} decoder steps for {stats.tokens} tokens)")


if __name__ == "__main__":
    main()
