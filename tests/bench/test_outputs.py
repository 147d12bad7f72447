"""Greedy outputs compared across profiles (issue 9 point 5): the comparison, then both outcomes on the
simulator through real pytest runs (the output_variant knob changes one profile's text)."""

from __future__ import annotations

import pytest

from pytest_sglang.bench.outputs import Output, OutputSet, compare_outputs, greedy_outputs
from pytest_sglang.errors import ServerRequestError
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


def _with_top(profile: str, ids: list[int], top: list[list[tuple[int, float]] | None]) -> OutputSet:
    s = OutputSet(profile)
    s.add([Output("p", len(ids), " ".join(map(str, ids)), tuple(ids), tuple(None if c is None else tuple(c)
                                                                              for c in top))])
    return s


def test_a_divergence_names_each_sides_margin_and_the_tie_margin_that_accepts_it() -> None:
    a = _with_top("baseline", [1, 2, 3], [[(1, -0.1)], [(2, -0.70), (9, -0.703)], [(3, -0.2)]])
    b = _with_top("eagle3", [1, 9, 4], [[(1, -0.1)], [(9, -0.69), (2, -0.6945)], [(4, -0.3)]])
    out = compare_outputs(a, b)
    assert out.failed and out.differences[0].token == 1
    ma, mb = out.differences[0].margins
    assert ma == pytest.approx(0.003) and mb == pytest.approx(0.0045)
    assert "margins (from the servers' top logprobs): baseline's token led eagle3's by 0.003 nats under " \
           "baseline, eagle3's led baseline's by 0.0045 nats under eagle3; a near tie: compare_outputs(..., " \
           "tie_margin=0.005) would accept this divergence" in out.message, out.message
    tied = compare_outputs(a, b, tie_margin=0.005)
    assert not tied.failed and tied.differences == () and len(tied.ties) == 1
    assert tied.message.startswith("greedy outputs of profiles 'baseline' and 'eagle3': 1 of 1 prompts diverged "
                                   "at a near tie (both margins within tie_margin=0.005 nats), the rest equal")
    assert compare_outputs(a, b, tie_margin=0.004).failed  # eagle3's lead, 0.0045, is wider
    # what the H200 showed: bf16 logits one step (1/64) apart on one side and equal on the other
    tie = _with_top("eagle3", [1, 9, 4], [[(1, -0.1)], [(9, -0.5), (2, -0.5)], [(4, -0.3)]])
    assert "eagle3's led baseline's by 0 nats (an exact tie) under eagle3" in compare_outputs(a, tie).message


def test_no_near_tie_where_a_token_is_not_among_the_others_candidates() -> None:
    a = _with_top("a", [1, 2], [[(1, -0.1)], [(2, -0.01), (7, -5.0)]])
    b = _with_top("b", [1, 9], [[(1, -0.1)], [(9, -0.01), (2, -0.02)]])
    out = compare_outputs(a, b, tie_margin=10.0)
    assert out.failed and out.differences[0].margins == (None, 0.01)
    assert "no margins: a's top 2 logprobs do not hold the other profile's token (not a near tie)" in out.message, \
        out.message
    no_logprobs = compare_outputs(outset("a", [("p", "x y", [1, 2])]), outset("b", [("p", "x z", [1, 9])]),
                                  tie_margin=10.0)
    assert no_logprobs.failed and "margins" not in no_logprobs.message and "near tie" not in no_logprobs.message
    with pytest.raises(ValueError, match="tie_margin must be a logprob difference in nats"):
        compare_outputs(a, b, tie_margin=-1)


def test_why_a_divergence_has_no_margins_and_what_a_negative_one_means() -> None:
    a = _with_top("a", [1, 2], [[(1, -0.1)], None])
    b = _with_top("b", [1, 9], [[(1, -0.1)], [(9, -0.01), (2, -0.02)]])
    assert "no margins: a gave no logprobs at position 1" in compare_outputs(a, b).message
    short = OutputSet("b")
    short.add([Output("p", 2, "1", (1,), (((1, -0.1),),))])  # stopped at its end of sequence after one token
    assert "no margins: one output ended there" in compare_outputs(a, short).message
    # b's own token trailed a's there: b was not choosing greedily between them, so no tie_margin accepts it
    odd = _with_top("b", [1, 9], [[(1, -0.1)], [(2, -0.01), (9, -4.9)]])
    lead = _with_top("a", [1, 2], [[(1, -0.1)], [(2, -0.01), (9, -0.011)]])
    out = compare_outputs(lead, odd, tie_margin=0.01)
    assert out.failed and "b's led a's by -4.89 nats under b; not a near tie" in out.message, out.message
    # both sides exactly tied: the suggested tie_margin is positive, and does accept it
    ta = _with_top("a", [1, 2], [[(1, -0.1)], [(2, -0.5), (9, -0.5)]])
    tb = _with_top("b", [1, 9], [[(1, -0.1)], [(9, -0.5), (2, -0.5)]])
    assert "compare_outputs(..., tie_margin=0.001) would accept" in compare_outputs(ta, tb).message
    accepted = compare_outputs(ta, tb, tie_margin=0.001)
    assert not accepted.failed and "accepted as a near tie" in accepted.message, accepted.message


class FakeClient:
    """Answers like a server: ``answers`` are returned in turn (an exception is raised); records each call."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, dict]] = []

    def _next(self, api: str, kwargs: dict) -> object:
        self.calls.append((api, kwargs))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def generate(self, prompt: object, **kwargs: object) -> object:
        return self._next("generate", dict(kwargs))

    def completions(self, prompt: object, **kwargs: object) -> object:
        return self._next("completions", dict(kwargs))


def test_vllm_top_logprobs_are_read_by_token_id_and_a_text_key_is_not_an_id() -> None:
    vllm = {"choices": [{"text": " a b", "token_ids": [5, 6], "logprobs": {"top_logprobs": [
        {"token_id:5": -0.1, "token_id:8": -2.0}, {"token_id:6": -0.3, ":7": -0.4}]}}]}
    client = FakeClient(vllm)
    (out,) = greedy_outputs(client, "vllm", ["p"], max_tokens=2, model="m")
    assert out.token_ids == (5, 6) and out.top_logprobs == (((5, -0.1), (8, -2.0)), None)
    assert client.calls[0][1] == {"max_tokens": 2, "model": "m", "return_token_ids": True, "logprobs": 5,
                                  "return_tokens_as_token_ids": True}


def test_a_server_refusing_logprobs_is_asked_again_without_and_a_plain_one_only_once() -> None:
    refused = ServerRequestError("logprobs not supported", status=400)
    client = FakeClient(refused, {"text": " x", "output_ids": [3], "meta_info": {}})
    (out,) = greedy_outputs(client, "sglang", [[1, 2]], max_tokens=1)
    assert out.token_ids == (3,) and out.top_logprobs is None
    assert [c[1].get("fields") for c in client.calls] == [{"return_logprob": True, "top_logprobs_num": 5}, {}]
    with pytest.raises(ServerRequestError):
        greedy_outputs(FakeClient(ServerRequestError("boom", status=500)), "sglang", ["p"], max_tokens=1)
    plain = FakeClient(ServerRequestError("Unexpected fields", status=422))
    with pytest.raises(ServerRequestError):
        greedy_outputs(plain, "generic", ["p"], max_tokens=1)
    assert len(plain.calls) == 1  # nothing was asked that a strict OpenAI server could refuse


@pytest.mark.parametrize("meta", [
    "not a dict", {"output_top_logprobs": "odd"}, {"output_top_logprobs": [[[None, 4, None]], [[float("inf"),
                                                                                                 float("inf")]]]},
])
def test_odd_logprob_answers_never_fail_the_outputs(meta: object) -> None:
    client = FakeClient({"text": " x y", "output_ids": [4, 5], "meta_info": meta})
    (out,) = greedy_outputs(client, "sglang", ["p"], max_tokens=2)
    assert out.token_ids == (4, 5) and out.top_logprobs in (None, (None, None))


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


def _project(pytester: pytest.Pytester, variant: int, margin: float = 4.0, inner: str = INNER) -> None:
    knobs = f"startup_seconds = 0.3, decode_tok_s = 400, ttft_ms = 5, output_margin = {margin}"
    pytester.makefile(".toml", pyproject=(
        '[tool.pytest_sglang.profiles.baseline]\nmodel = "sim-model"\n'
        f"sim = {{ {knobs} }}\n"
        '[tool.pytest_sglang.profiles.eagle3]\nextends = "baseline"\n'
        'args = ["--speculative-algorithm", "EAGLE3"]\n'
        f"sim = {{ {knobs}, output_variant = {variant} }}\n"))
    pytester.makepyfile(test_inner=inner)


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
    assert ("margins (from the servers' top logprobs): baseline's token led eagle3's by 4 nats under baseline, "
            "eagle3's led baseline's by 4 nats under eagle3; not a near tie (a lead over 0.1 nats is a preference, "
            "not rounding)") in out, out


NEAR_TIE = INNER.split("@pytest.mark.sglang_compare")[0] + '''
@pytest.mark.sglang_compare
def test_strict(sglang_results):
    sglang_results.compare_outputs("baseline", "eagle3")


@pytest.mark.sglang_compare
def test_near_ties_accepted(sglang_results):
    cmp = sglang_results.compare_outputs("baseline", "eagle3", tie_margin=0.01)
    assert cmp.differences == () and len(cmp.ties) == 3
'''


def test_a_divergence_at_a_near_tie_fails_with_its_margins_unless_tie_margin_accepts_it(
        pytester: pytest.Pytester) -> None:
    _project(pytester, 1, margin=0.002, inner=NEAR_TIE)
    result = _run(pytester)
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "test_strict FAILED" in out or "FAILED test_inner.py::test_strict" in out, out
    assert ("baseline's token led eagle3's by 0.002 nats under baseline, eagle3's led baseline's by 0.002 nats "
            "under eagle3; a near tie: compare_outputs(..., tie_margin=0.002) would accept this divergence") in out, out
