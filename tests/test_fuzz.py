"""Fuzzing each parser the build reads a user's file with: safetensors headers, the shard index,
config.json and generation_config.json, GGUF headers and metadata, LoRA adapters, YAML build files.

tests/fuzz_cases.py makes a few hundred malformed inputs from valid tiny ones (truncations, byte
flips, huge counts and lengths, values of the wrong type, deep nesting, overlapping tensors), with a
fixed seed; each must end in exit code 2 with one `error:` line, or be read as the format's own
reader reads it (and, for some, build a model that runs), in bounded time and memory. A longer run
with more cases and other seeds: `python scripts/fuzz_inputs.py --cases 5000 --seed 7`.
"""

import pytest
from fuzz_cases import CI_COUNTS, generate, make_bases, run_case

SEED = 21
# Cases that expose a defect not fixed yet, each a strict xfail naming it (none today: the seven
# found while writing the fuzzer are fixed, each case now a regression test).
KNOWN: dict[str, str] = {}  # by Case.what: a case that exposes a defect not fixed yet (a strict xfail)
CASES = generate(SEED, CI_COUNTS)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return make_bases(tmp_path_factory.mktemp("fuzz-bases"))


def _param(case):
    marks = [pytest.mark.xfail(reason=KNOWN[case.what], strict=True)] if case.what in KNOWN else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_malformed_input_is_refused_in_one_line_or_read_right(case, bases, tmp_path):
    outcome = run_case(case, bases, tmp_path)
    assert outcome.problem is None, (
        f"{outcome.problem}\n  reproduce: python scripts/fuzz_inputs.py --cases {len(CASES)} --seed {SEED} "
        f"--only {case.id}")


def test_the_cases_cover_every_parser_and_stay_the_same():
    """Every parser has cases; the generator is deterministic (a seed names the same cases)."""
    assert {c.parser for c in CASES} == {"safetensors", "index", "config", "generation", "gguf", "lora", "yaml"}
    assert len(CASES) == sum(CI_COUNTS.values()) and len({c.id for c in CASES}) == len(CASES)
    assert [c.id for c in generate(SEED, CI_COUNTS)] == [c.id for c in CASES]
    assert KNOWN.keys() <= {c.what for c in CASES}
