"""Greedy outputs compared across profiles (issue 9 point 5): the comparison, then both outcomes on the
simulator through real pytest runs (the output_variant knob changes one profile's text)."""

from __future__ import annotations

import pytest

from pytest_sglang.bench.outputs import Output, OutputSet, compare_outputs
from pytest_sglang.sim.engine import VARIANT_FROM


def outset(profile: str, rows: list[tuple[str, str, list[int] | None]], max_tokens: int = 8) -> OutputSet:
    s = OutputSet(profile)
    s.add([Output(p, max_tokens, text, tuple(ids) if ids is not None else None) for p, text, ids in rows])
    return s


def test_equal_token_ids_are_equal_whatever_the_text() -> None:
    a = outset("base", [("p1", " a b", [1, 2]), ("p2", " c", [3])])
    b = outset("eagle3", [("p1", " a b", [1, 2]), ("p2", " c ", [3])])
    out = compare_outputs(a, b)
    assert not out.failed and out.compared == 2 and "equal on all 2 prompts" in out.message


def test_the_first_differing_prompt_and_token_with_both_texts() -> None:
    a = outset("base", [("same", " x", [9]), ("The capital of France is", " Paris, the city of light", [5, 6, 7, 8])])
    b = outset("eagle3", [("same", " x", [9]), ("The capital of France is", " Paris, the town of", [5, 6, 17, 18])])
    out = compare_outputs(a, b)
    assert out.failed and len(out.differences) == 1
    msg = out.message
    assert "1 of 2 prompts differ (allowed: 0)" in msg
    assert 'prompt 1 "The capital of France is": first differing token at position 2 (of 4 and 4): base 7 vs ' \
           "eagle3 17" in msg, msg
    assert "base:   " in msg and " Paris, the [>>]city of light" in msg and " Paris, the [>>]town of" in msg, msg
    assert not compare_outputs(a, b, allow_differing=1).failed


def test_text_only_servers_compare_characters_and_a_shorter_output_differs() -> None:
    a = outset("a", [("p", "hello world", None), ("q", "abc", [1, 2, 3])])
    b = outset("b", [("p", "hello there", None), ("q", "ab", [1, 2])])
    out = compare_outputs(a, b)
    assert len(out.differences) == 2
    assert "first differing character at 6 (compared as text" in out.message
    assert "first differing token at position 2 (of 3 and 2): a 3 vs b (end)" in out.message


def test_a_prompt_recorded_under_one_profile_only_differs() -> None:
    out = compare_outputs(outset("a", [("p", "x", [1]), ("q", "y", [2])]), outset("b", [("p", "x", [1])]))
    assert out.failed and "no output under profile 'b'" in out.message
    with pytest.raises(ValueError, match="allow_differing"):
        compare_outputs(outset("a", []), outset("b", []), allow_differing=-1)
    assert compare_outputs(outset("a", []), outset("b", [])).failed  # nothing compared is no pass


INNER = '''
import pytest

PROMPTS = ["The capital city of France is", "def fibonacci(n):", [11, 12, 13, 14]]


def test_outputs(sglang_outputs):
    outs = sglang_outputs(PROMPTS, max_tokens=12)
    assert len(outs) == 3 and all(len(o.token_ids) == 12 and o.text for o in outs)
    assert sglang_outputs(PROMPTS, max_tokens=12) == outs  # greedy: the same twice


@pytest.mark.sglang_compare
def test_same_outputs(sglang_results):
    sglang_results.compare_outputs("baseline", "eagle3")


@pytest.mark.sglang_compare
def test_tolerated(sglang_results):
    assert len(sglang_results.compare_outputs("baseline", "eagle3", allow_differing=3).differences) in (0, 3)
'''


def _project(pytester: pytest.Pytester, variant: int) -> None:
    pytester.makefile(".toml", pyproject=(
        '[tool.pytest_sglang.profiles.baseline]\nmodel = "sim-model"\n'
        "sim = { startup_seconds = 0.3, decode_tok_s = 400, ttft_ms = 5 }\n"
        '[tool.pytest_sglang.profiles.eagle3]\nextends = "baseline"\n'
        'args = ["--speculative-algorithm", "EAGLE3"]\n'
        f"sim = {{ startup_seconds = 0.3, decode_tok_s = 400, ttft_ms = 5, output_variant = {variant} }}\n"))
    pytester.makepyfile(test_inner=INNER)


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=baseline,eagle3",
                                         "--sglang-sim", timeout=120)


def test_equal_outputs_pass_across_profiles(pytester: pytest.Pytester) -> None:
    _project(pytester, 0)
    _run(pytester).assert_outcomes(passed=4)


def test_a_changed_output_fails_naming_prompt_and_token(pytester: pytest.Pytester) -> None:
    _project(pytester, 1)
    result = _run(pytester)
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "greedy outputs differ between profiles 'baseline' and 'eagle3': 3 of 3 prompts differ (allowed: 0)" \
        in out, out
    assert (f'prompt 0 "The capital city of France is": first differing token at position {VARIANT_FROM} (of 12 '
            "and 12)") in out, out
    assert "baseline: " in out and "eagle3:   " in out and "[>>]" in out
