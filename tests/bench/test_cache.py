"""Rounds that measure the workload asked for (issue 24 point 0): ``run_bench(cache="fresh" | "flush" | "warm")``
on the simulator, its prefix cache witnessed by its /metrics (SGLang's and vLLM's names) and by the prompts its
request trace fingerprints; the flush refused and missing; a cached round flagged."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import requests

from pytest_sglang.bench import cache, run_bench
from pytest_sglang.bench.cache import CachedRoundWarning, CacheFlushError
from pytest_sglang.errors import BenchmarkError
from pytest_sglang.sim.trace import read_trace

from .simproc import SimServer, run_sim

FAST = {"decode_tok_s": 500, "ttft_ms": 5}
WORK = {"num_requests": 4, "concurrency": 2, "input_len": 32, "output_len": 4, "warmup": 1, "rounds": 3}


def bench(sim: SimServer, **kwargs: object) -> tuple[object, list[str]]:
    """run_bench and the CachedRoundWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_bench(sim, **{**WORK, **kwargs})  # type: ignore[arg-type]
    return r, [str(w.message) for w in caught if issubclass(w.category, CachedRoundWarning)]


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_each_mode_witnessed_by_the_servers_prefix_cache(tmp_path: Path, fmt: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The zeros below are these seeds' prompts: an xdist worker draws its own (prompts.set_seed), and worker
    # gw1's share one first token in 128 with a cached prompt by chance. This test's server is its own.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    trace = tmp_path / "trace.jsonl"
    args = ("--enable-metrics",) if fmt == "sglang" else ()
    with run_sim(tmp_path, {**FAST, "metrics_format": fmt, "request_trace": str(trace)}, *args) as sim:
        sim.kind = fmt  # the flush goes to SGLang's /flush_cache or vLLM's /reset_prefix_cache
        warm, flags = bench(sim, cache="warm")
        hits = [r.server_cache_hit_rate for r in warm.rounds]
        assert hits[0] == 0.0 and hits[1] == hits[2] == pytest.approx(31 / 32), hits  # all but the last token
        assert warm.cache == "warm" and warm.cache_note is None and not flags  # cached on purpose: no flag
        assert [r.server_cached_tokens for r in warm.rounds] == [0, 4 * 31, 4 * 31]
        flushed, flags = bench(sim, cache="flush")  # the same prompts again: flushed after the warmup, each round
        assert [r.server_cache_hit_rate for r in flushed.rounds] == [0.0, 0.0, 0.0] and not flags
        fresh, flags = bench(sim)  # the default
        assert fresh.cache == "fresh" and [r.server_cache_hit_rate for r in fresh.rounds] == [0.0, 0.0, 0.0]
        assert not flags and fresh.server_cache_hit_rate == 0.0 and fresh.spread["server_cache_hit_rate"].n == 3
        report = fresh.to_dict()
        assert report["cache"] == "fresh" and [r["server_cache_hit_rate"] for r in report["rounds"]] == [0.0] * 3
    runs = [read_trace(trace)[k * 13:(k + 1) * 13] for k in range(3)]  # each run: 1 warmup + 3 rounds of 4
    warm_rounds, flush_rounds, fresh_rounds = ([{t["prompt"] for t in run[1 + 4 * j:5 + 4 * j]} for j in range(3)]
                                               for run in runs)
    assert warm_rounds[0] == warm_rounds[1] == warm_rounds[2] == flush_rounds[0] == flush_rounds[2]
    assert len(set().union(*fresh_rounds)) == 12, fresh_rounds  # every round its own 4 prompts
    assert not set().union(*fresh_rounds) & warm_rounds[0]
    assert {runs[2][0]["prompt"]}.isdisjoint(set().union(*fresh_rounds))  # the warmup primes none of them


def test_fresh_prompts_are_reproducible_and_never_repeat_on_one_server(tmp_path: Path) -> None:
    traces = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    with run_sim(tmp_path, {**FAST, "request_trace": str(traces[0])}, "--enable-metrics") as a, \
            run_sim(tmp_path, {**FAST, "request_trace": str(traces[1])}, "--enable-metrics") as b:
        bench(a)
        bench(b)  # another server: the same seeded sets, in the same order
        again, flags = bench(a)  # the same server again (a sweep's next point): sets it has not been sent
        assert [r.server_cache_hit_rate for r in again.rounds] == [0.0, 0.0, 0.0] and not flags
    first_a, first_b = read_trace(traces[0])[:13], read_trace(traces[1])
    assert [t["prompt"] for t in first_a] != [] and sorted(t["prompt"] for t in first_a) == \
        sorted(t["prompt"] for t in first_b)
    second_a = read_trace(traces[0])[13:]
    assert len(second_a) == 13 and not {t["prompt"] for t in second_a} & {t["prompt"] for t in first_a}


def test_another_client_with_the_same_prompts_is_flagged(tmp_path: Path) -> None:
    """A second process (a pytest-xdist worker, another job) sends the same seeded prompts to the server first:
    "fresh" rounds it finds cached are flagged with the rate and what to do."""
    with run_sim(tmp_path, FAST, "--enable-metrics") as sim:
        code = ("import sys; from pytest_sglang.bench import run_bench; "
                f"run_bench(sys.argv[1], **{WORK!r})")
        subprocess.run([sys.executable, "-c", code, sim.base_url], check=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
        r, flags = bench(sim)
        assert [x.server_cache_hit_rate for x in r.rounds] == [pytest.approx(31 / 32)] * 3
        assert len(flags) == 3 and "round 1: the server served 97% of the prompt tokens from its prefix cache " \
            "although cache='fresh' should measure an uncached workload" in flags[1], flags
        assert "use cache='flush'" in flags[1] and r.cache_note is not None and r.cache_note.count("round ") == 3
        assert r.to_dict()["cache_note"] == r.cache_note and r.to_dict()["rounds"][2]["cache_note"]


def test_flush_with_repeats_inside_a_round_is_flagged(tmp_path: Path) -> None:
    with run_sim(tmp_path, FAST, "--enable-metrics") as sim:
        prompts = [[1000 + i for i in range(16)]] * 4  # given prompts: "flush" by default
        r, flags = bench(sim, prompts=prompts, concurrency=1, rounds=2)
        assert r.cache == "flush"
        assert [x.server_cache_hit_rate for x in r.rounds] == [pytest.approx(3 * 15 / 64)] * 2
        assert len(flags) == 2 and "its prompts repeat within the round" in flags[0]


def test_flush_refused_while_another_client_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "FLUSH_WAIT_S", 1.0)
    with run_sim(tmp_path, {"decode_tok_s": 50, "ttft_ms": 5}, "--enable-metrics") as sim:
        body = {"prompt": [5, 6, 7], "max_tokens": 200, "stream": False}  # 4 s at 50 tok/s
        other = threading.Thread(target=requests.post, args=(sim.base_url + "/v1/completions",),
                                 kwargs={"json": body, "timeout": 60})
        other.start()
        try:
            with pytest.raises(CacheFlushError) as info:
                run_bench(sim, cache="flush", num_requests=2, input_len=8, output_len=2, warmup=1, rounds=2)
        finally:
            other.join()
        text = str(info.value)
        assert "SGLang answered POST /flush_cache with HTTP 400 ('Timed out waiting for idle state.') for 1 s" \
            in text and "no other client loads the server, or use cache='fresh'" in text, text
        assert isinstance(info.value, BenchmarkError)


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_a_server_without_the_flush_endpoint(tmp_path: Path, fmt: str) -> None:
    """vLLM serves /reset_prefix_cache only under VLLM_SERVER_DEV_MODE=1: a 404 names that, and the other modes."""
    with run_sim(tmp_path, FAST) as sim:  # an SGLang server: it has no /reset_prefix_cache
        sim.kind = "vllm"
        with pytest.raises(CacheFlushError) as info:
            run_bench(sim, cache="flush", num_requests=2, input_len=8, output_len=2)
        assert "vLLM answered POST /reset_prefix_cache with HTTP 404" in str(info.value)
        assert "VLLM_SERVER_DEV_MODE=1" in str(info.value) and "cache='fresh'" in str(info.value)
        assert run_bench(sim, num_requests=2, input_len=8, output_len=2).cache == "fresh"  # needs no flush
    if fmt == "vllm":
        with run_sim(tmp_path, {**FAST, "metrics_format": "vllm"}) as sim:
            sim.kind = "vllm"
            assert run_bench(sim, cache="flush", num_requests=2, input_len=8, output_len=2).ok


def test_bad_cache_arguments(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="cache must be one of 'fresh', 'flush', 'warm', got 'cold'"):
        run_bench("http://127.0.0.1:9", cache="cold")
    with pytest.raises(BenchmarkError, match="prompts= were given and cannot be redrawn: pass cache='flush'"):
        run_bench("http://127.0.0.1:9", cache="fresh", prompts=[[1, 2]], num_requests=1)


def test_the_report_shows_each_rounds_hit_rate(pytester: pytest.Pytester, mark: str) -> None:
    from helpers import profile_toml

    pytester.makefile(".toml", pyproject=profile_toml("p", mark, body='args = ["--enable-metrics"]',
                                                      sim="startup_seconds = 0.2, decode_tok_s = 500, ttft_ms = 5"))
    pytester.makepyfile(test_x='''
def test_warm(sglang_bench):
    sglang_bench(num_requests=4, input_len=16, output_len=2, rounds=2, cache="warm")

def test_fresh(sglang_bench):
    sglang_bench(num_requests=4, input_len=16, output_len=2, rounds=2)
''')
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--sglang-profile=p",
                                           f"--sglang-report={report}", timeout=120)
    result.assert_outcomes(passed=2)
    shown = json.loads(report.read_text())["profiles"]["p"]["benchmarks"]
    benches = {b["test_id"].rsplit("::", 1)[-1]: b["result"] for b in shown}
    assert [r["server_cache_hit_rate"] for r in benches["test_warm"]["rounds"]] == [0.0, pytest.approx(15 / 16)]
    assert benches["test_fresh"]["cache"] == "fresh" and benches["test_fresh"]["server_cache_hit_rate"] == 0.0
    result.stdout.fnmatch_lines(["*prefix cache: p test_warm: cache='warm', the server's hit rate per round 0% 94%*",
                                 "*prefix cache: p test_fresh: cache='fresh', the server's hit rate per round 0% 0%*"])


def test_the_two_sides_of_an_ab_pair_get_the_same_prompts(pytester: pytest.Pytester, mark: str) -> None:
    """sglang_ab (interleaved): each pair's two rounds send the same prompts, every pair (and the warmup round)
    its own, on both servers; each server's witness says no round was cached. (The earlier test on one side
    only leaves its trace in a server the A/B launches anew: the plugin keeps one server at a time here.)"""
    from helpers import profile_toml

    traces = {p: pytester.path / f"{p}.jsonl" for p in ("main", "cand")}
    fast = "startup_seconds = 0.2, decode_tok_s = 500, ttft_ms = 5"
    pytester.makefile(".toml", pyproject="".join(
        profile_toml(p, mark, body='args = ["--enable-metrics"]', sim=f"{fast}, request_trace = '{traces[p]}'")
        for p in traces))
    pytester.makepyfile(test_x='''
import pytest

def test_before(sglang_server, sglang_bench):
    if sglang_server.profile != "main":
        pytest.skip("an earlier test on one side only")
    sglang_bench(num_requests=4, input_len=16, output_len=2, rounds=2)

@pytest.mark.sglang_ab("main", "cand")
def test_ab(sglang_ab):
    r = sglang_ab(num_requests=4, concurrency=4, input_len=16, output_len=2, rounds=3)
    hits = {p: [x.server_cache_hit_rate for x in rs] for p, rs in r.rounds.items()}
    assert hits == {"main": [0.0] * 3, "cand": [0.0] * 3}, hits
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--sglang-profile=main,cand",
                                           timeout=180)
    result.assert_outcomes(passed=2, skipped=1)
    main, cand = (read_trace(traces[p]) for p in ("main", "cand"))

    def runs(trace: list[dict]) -> list[set[int]]:  # the A/B's warmup round (1 + 4), then one round of 4 a pair
        return [{t["prompt"] for t in trace[:1]}, {t["prompt"] for t in trace[1:5]},
                *({t["prompt"] for t in trace[5 + 4 * k:9 + 4 * k]} for k in range(3))]

    assert len(main) == len(cand) == 17 and runs(main) == runs(cand)
    assert len(set().union(*runs(main))) == 17  # no prompt twice


def test_aligning_two_servers_after_a_one_sided_history(tmp_path: Path) -> None:
    """What sglang_ab does before each pair (PromptSets.align): one server has been sent sets the other has not;
    both then draw the next set neither has seen, the same one."""
    traces = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    with run_sim(tmp_path, {**FAST, "request_trace": str(traces[0])}, "--enable-metrics") as a, \
            run_sim(tmp_path, {**FAST, "request_trace": str(traces[1])}, "--enable-metrics") as b:
        bench(a)  # a: the warmup's set and 3 rounds'
        cache.PROMPT_SETS.align([a.base_url, b.base_url])
        ra, _ = bench(a, warmup=0, rounds=1)
        rb, _ = bench(b, warmup=0, rounds=1)
        assert ra.server_cache_hit_rate == rb.server_cache_hit_rate == 0.0
    sent_a, sent_b = read_trace(traces[0]), read_trace(traces[1])
    assert len(sent_a) == 17 and len(sent_b) == 4
    assert {t["prompt"] for t in sent_a[13:]} == {t["prompt"] for t in sent_b}
    assert not {t["prompt"] for t in sent_a[:13]} & {t["prompt"] for t in sent_b}
