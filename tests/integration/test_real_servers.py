"""The plugin against the real SGLang 0.5.23 and vLLM 0.32 servers on the CPU, end to end.

One launch per server for every happy-path check, in two inner pytest sessions that share it through
--sglang-reuse:
  A  launches the server (kept for reuse), runs the inner tests and records the baseline
     (--sglang-update-baseline);
  B  attaches to the same server, runs the same inner tests and checks them against that baseline (the outer
     tests assert the baseline was found and nothing regressed; "not judged" on these noisy cores is allowed).
Then the outer fixture stops the kept server with `pytest --sglang-stop` and checks that no process of it
(launcher, scheduler, detokenizer / APIServer, EngineCore, Worker) survived. The server log must show exactly
one start. The outer tests assert on the inner junit outcomes, the --sglang-report JSON and the log.

The faults each need a launch of their own (a broken server cannot be shared): a corrupted safetensors file
and an unknown architecture for SGLang, a bad flag for each, and for vLLM a model whose head dimension its CPU
attention rejects only at the first request.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from realservers import (
    READY_LINE,
    InnerProject,
    InnerRun,
    TinyModels,
    profile_toml,
    reap,
    server_python,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

BENCH = {"num_requests": 16, "concurrency": 4, "input_len": 32, "output_len": 32, "warmup": 2}

# The inner tests: what a user of the plugin writes. `sglang_server.kind` tells the two servers apart.
INNER_HAPPY = '''
import json
import os

import pytest
import requests

PROMPT = "The capital city of France is"
BENCH = {bench!r}


def model_id(server):
    return requests.get(server.url("/v1/models"), timeout=30).json()["data"][0]["id"]


def complete(server, max_tokens):
    r = requests.post(server.url("/v1/completions"), timeout=120, json={{
        "model": model_id(server), "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_answers(sglang_server):
    body = complete(sglang_server, 8)
    choice = body["choices"][0]
    assert choice["text"].strip(), body
    assert choice["finish_reason"] == "length", body
    assert body["usage"]["completion_tokens"] == 8, body


def test_greedy_output_is_repeatable(sglang_server):
    first = complete(sglang_server, 16)["choices"][0]["text"]
    second = complete(sglang_server, 16)["choices"][0]["text"]
    assert first == second
    with open(os.environ["GREEDY_OUT"], "a") as f:
        f.write(json.dumps(first) + "\\n")


def test_streamed_chat_completion(sglang_server):
    body = {{"model": model_id(sglang_server), "messages": [{{"role": "user", "content": "Hello there"}}],
            "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {{"include_usage": True}}}}
    events = []
    with requests.post(sglang_server.url("/v1/chat/completions"), json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                events.append(line[len(b"data: "):])
    assert events and events[-1] == b"[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
    assert sum(1 for d in deltas if d) >= 2, chunks
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 8, usage


def test_native_generate_meta_info(sglang_server):
    if sglang_server.kind != "sglang":
        pytest.skip("/generate is SGLang's native API")
    r = requests.post(sglang_server.url("/generate"), timeout=120, json={{
        "text": PROMPT, "sampling_params": {{"max_new_tokens": 8, "temperature": 0}}}})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert out["text"], out
    assert meta["completion_tokens"] == 8, meta
    assert meta["prompt_tokens"] > 0, meta
    assert meta["e2e_latency"] > 0, meta
    assert "cached_tokens" in meta, meta


def test_greedy_outputs_with_token_ids(sglang_outputs):
    (out,) = sglang_outputs([PROMPT], max_tokens=8)
    assert out.token_ids is not None and len(out.token_ids) == 8 and out.text, out
    # each position's top logprobs, read from this server's own answer: greedy picked a best candidate (an
    # exact tie may list the other first)
    top = out.top_logprobs
    assert top is not None and len(top) == 8, top
    assert all(cands and len(cands) >= 2 and dict(cands).get(token) == cands[0][1]
               for cands, token in zip(top, out.token_ids)), top


def test_startup_duration_and_phases(sglang_server, sglang_baseline):
    s = sglang_server
    assert s.startup_seconds > 0
    assert {{"load_weights", "kv_cache", "ready"}} <= set(s.phases), s.phases
    assert 0 < s.phases["load_weights"] < s.phases["kv_cache"] <= s.phases["ready"], s.phases
    assert s.phases["ready"] <= s.startup_seconds + 1.0, (s.phases, s.startup_seconds)
    assert s.log_path is not None and s.log_path.exists()
    sglang_baseline.check(s, startup_seconds="300%")


def test_bench_figures(sglang_server, sglang_bench, sglang_baseline):
    r = sglang_bench(**BENCH)
    n, out_len = BENCH["num_requests"], BENCH["output_len"]
    assert (r.completed, r.failed) == (n, 0)
    # A 384-token vocabulary: ids from the model's config.json, never one it lacks (issue 9 point 1).
    assert r.prompt_kind == "token_ids" and "vocab_size 384 from" in (r.prompt_vocab or ""), r.prompt_vocab
    if sglang_server.kind == "vllm":  # vLLM always serves /metrics: its own token count is a second witness
        assert r.server_generation_tokens == r.total_output_tokens, r.to_dict()
    assert r.total_output_tokens == n * out_len  # the server's own counts, exactly
    assert r.total_input_tokens == n * BENCH["input_len"]
    assert r.duration > 0 and r.output_throughput > 0
    assert r.output_throughput == pytest.approx(r.total_output_tokens / r.duration)
    assert 0 < r.median_ttft_ms <= r.p99_ttft_ms
    # vLLM on CPU often delivers several stream events in one read: the median gap can be 0.
    assert r.median_itl_ms >= 0 and r.mean_itl_ms > 0 and r.median_e2e_latency_ms > r.median_ttft_ms
    assert r.accept_length is None
    # 2 cores shared by server and client: figures swing 2-4x between runs, and 15x was seen while another
    # job compiled on the same machine. This checks the mechanism (recorded, found, compared by direction); the
    # regression arithmetic itself is tested exactly on the simulator (tests/bench).
    sglang_baseline.check(r, output_throughput="99%", median_ttft_ms="5000%")
'''


class HappyRun:
    """The shared launch: inner runs A (record) and B (check), the server log, leftovers after the stop."""

    def __init__(self, kind: str, a: InnerRun, b: InnerRun | None, log_text: str, greedy: list[str],
                 leftovers: list[str], baseline: dict | None) -> None:
        self.kind, self.a, self.b = kind, a, b
        self.log_text, self.greedy, self.leftovers, self.baseline = log_text, greedy, leftovers, baseline


def _stop_reused(project: InnerProject) -> None:
    """Stop the server that --sglang-reuse kept, as a user does: `pytest --sglang-stop`."""
    stop = project.run("--sglang-stop", tag="stop", timeout=120)
    assert stop.returncode == 0, stop.stdout


def _happy(kind: str, tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> Iterator[HappyRun]:
    python = server_python(kind)
    model = tiny_models.get("small_vocab", python)  # 384 ids: the old [1000, 30000) draw would break both servers
    mark = uuid.uuid4().hex
    project = InnerProject(tmp_path_factory.mktemp(f"{kind}-happy"), mark)
    project.write("profiles.toml", profile_toml(kind, kind, python=python, model=model, mark=mark))
    project.write("test_inner.py", INNER_HAPPY.format(bench=BENCH))
    greedy_out = project.path / "greedy.jsonl"
    common = [f"--sglang-profile={kind}", "--sglang-reuse", f"--sglang-baseline={project.path / 'baseline.json'}"]
    env = {"GREEDY_OUT": str(greedy_out)}
    b = None
    try:
        a = project.run(*common, "--sglang-update-baseline", tag="a", env=env)
        baseline_path = project.path / "baseline.json"
        baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else None
        if a.returncode == 0:
            # Not strict: on 2 shared cores a check may be "not judged" (too noisy, client-bound), which is the
            # gate's answer, not a failure of the mechanism; test_baseline_recorded_then_checked asserts the
            # baseline was found and nothing regressed.
            b = project.run(*common, tag="b", env=env)
    finally:
        _stop_reused(project)
        leftovers = reap(mark)
    log_path = project.log_dir / f"{kind}.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    greedy = [json.loads(line) for line in greedy_out.read_text().splitlines()] if greedy_out.exists() else []
    yield HappyRun(kind, a, b, log_text, greedy, leftovers, baseline)


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def happy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          tiny_models: TinyModels) -> Iterator[HappyRun]:
    yield from _happy(request.param, tmp_path_factory, tiny_models)


# -- happy path: one launch per server ----------------------------------------------------------------------


def test_inner_session_passes_on_the_real_server(happy: HappyRun) -> None:
    a = happy.a
    assert a.returncode == 0, a.explain()
    assert {n: o.outcome for n, o in a.outcomes.items()} == {
        "test_completion_answers": "passed",
        "test_greedy_output_is_repeatable": "passed",
        "test_streamed_chat_completion": "passed",
        "test_native_generate_meta_info": "passed" if happy.kind == "sglang" else "skipped",
        "test_greedy_outputs_with_token_ids": "passed",
        "test_startup_duration_and_phases": "passed",
        "test_bench_figures": "passed",
    }, a.explain()


def test_second_session_reuses_the_server_and_checks_the_baseline(happy: HappyRun) -> None:
    assert happy.b is not None, "run A failed, so run B did not run"
    assert happy.b.returncode == 0, happy.b.explain()
    assert happy.log_text.count(READY_LINE[happy.kind]) == 1, "the server was launched more than once"
    assert happy.greedy and len(set(happy.greedy)) == 1, f"greedy output differs between sessions: {happy.greedy}"


def test_baseline_recorded_then_checked(happy: HappyRun) -> None:
    assert happy.baseline, "run A (--sglang-update-baseline) wrote no baseline file"
    text = json.dumps(happy.baseline)
    assert "test_bench_figures" in text and "output_throughput" in text
    assert happy.b is not None and happy.b.report is not None
    prof = happy.b.report["profiles"][happy.kind]
    (bench,) = prof["benchmarks"]
    checked = bench["baseline"]
    for metric in ("output_throughput", "median_ttft_ms"):
        assert checked[metric]["baseline"] is not None, checked
        assert checked[metric]["status"] not in ("regressed", "missing", "recorded"), checked
    assert prof["startup_baseline"] and prof["startup_baseline"]["baseline"] is not None, prof


def test_report_has_startup_phases_and_exact_bench_figures(happy: HappyRun) -> None:
    report = happy.a.report
    assert report is not None, happy.a.explain()
    prof = report["profiles"][happy.kind]
    assert prof["kind"] == happy.kind and prof["error"] is None
    assert prof["startup_seconds"] > 0
    assert {"load_weights", "kv_cache", "ready"} <= set(prof["phases"]), prof["phases"]
    (bench,) = prof["benchmarks"]
    r = bench["result"]
    n = BENCH["num_requests"]
    assert (r["completed"], r["failed"]) == (n, 0)
    assert r["total_output_tokens"] == n * BENCH["output_len"]
    assert r["total_input_tokens"] == n * BENCH["input_len"]
    for key in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_e2e_latency_ms"):
        assert r[key] > 0, (key, r)
    assert r["accept_length"] is None
    assert r["server_token_counts_missing"] == 0  # the counts are the server's, not the client's chunks
    assert bench["outcome"] == "passed"


def test_server_stopped_with_no_process_left(happy: HappyRun) -> None:
    assert happy.leftovers == [], f"processes of the {happy.kind} server survived its stop: {happy.leftovers}"


def test_the_stop_is_the_servers_own_shutdown_not_its_crash_path(happy: HappyRun) -> None:
    """The root is asked first: SGLang drains and stops its schedulers itself. A scheduler SIGTERMed with the
    whole group died with -15 first, and SGLang's subprocess watchdog logged it as a crash and SIGQUIT the tree."""
    if happy.kind != "sglang":
        pytest.skip("SGLang's subprocess watchdog only")
    assert "SIGTERM received" in happy.log_text, happy.log_text[-2000:]
    assert "crashed with exit code" not in happy.log_text, happy.log_text[-2000:]


# -- faults: each its own launch -------------------------------------------------------------------------------

INNER_ONE = '''
def test_needs_server(sglang_server):
    pass
'''

FAULTS = {
    # id: (kind, model variant, extra args, expected root-cause text, expected exit text)
    "sglang-corrupt-safetensors": ("sglang", "corrupt", [],
                                   "SafetensorError: Error while deserializing header", "exit code 137"),
    "sglang-unknown-architecture": ("sglang", "unknown_arch", [],
                                    "Cannot find model module. 'NoSuchArchForCausalLM'", "exit code 137"),
    "sglang-bad-flag": ("sglang", "ok", ["--no-such-flag", "1"],
                        "error: unrecognized arguments: --no-such-flag", "exit code 2"),
    # vLLM exits 1.6 s after printing the argparse error (atexit work); the plugin may kill it first.
    "vllm-bad-flag": ("vllm", "ok", ["--no-such-flag", "1"],
                      "error: unrecognized arguments: --no-such-flag", "exit code 2|still alive"),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_startup_fault_fails_fast_with_root_cause(case: str, tmp_path: Path, tiny_models: TinyModels,
                                                  mark: str) -> None:
    kind, variant, extra, cause, exit_text = FAULTS[case]
    python = server_python(kind)
    model = tiny_models.get(variant, python)
    project = InnerProject(tmp_path, mark)
    project.write("profiles.toml", profile_toml(case, kind, python=python, model=model, mark=mark,
                                                extra_args=extra))
    project.write("test_inner.py", INNER_ONE)
    run = project.run(f"--sglang-profile={case}", tag="fault")
    o = run.outcome("test_needs_server")
    assert o.outcome == "error", run.explain()
    assert cause in o.message, run.explain()
    assert re.search(exit_text, o.message), run.explain()
    assert "Full log:" in o.message
    # Benign lines that merely mention an error never stand in for the cause.
    assert "Ignore import error" not in o.message
    # It failed on the server's exit, not on the startup timeout (900 s).
    assert run.wall_seconds < 300, run.wall_seconds
    assert reap(mark) == []


INNER_CRASH = '''
import requests


def complete(server):
    return requests.post(server.url("/v1/completions"), timeout=60, json={
        "model": requests.get(server.url("/v1/models"), timeout=30).json()["data"][0]["id"],
        "prompt": "Hello", "max_tokens": 4, "temperature": 0})


def test_1_first_request_kills_the_server(sglang_server):
    r = complete(sglang_server)
    assert r.status_code == 200, r.text


def test_2_after_the_crash(sglang_server):
    assert complete(sglang_server).status_code == 200


def test_3_still_after_the_crash(sglang_server):
    assert complete(sglang_server).status_code == 200
'''


def test_vllm_crash_at_first_request_fails_the_next_tests_with_server_died(
        tmp_path: Path, tiny_models: TinyModels, mark: str) -> None:
    python = server_python("vllm")
    model = tiny_models.get("head_dim16", python)
    project = InnerProject(tmp_path, mark)
    project.write("profiles.toml", profile_toml("vllm-head-dim-16", "vllm", python=python, model=model,
                                                mark=mark))
    project.write("test_inner.py", INNER_CRASH)
    run = project.run("--sglang-profile=vllm-head-dim-16", tag="crash")
    first = run.outcome("test_1_first_request_kills_the_server")
    assert first.outcome == "failed", run.explain()
    for name in ("test_2_after_the_crash", "test_3_still_after_the_crash"):
        o = run.outcome(name)
        assert o.outcome == "failed", run.explain()
        assert re.search(r"server died", o.message, re.IGNORECASE), run.explain()
        assert "RuntimeError: Unsupported CPU attention configuration" in o.message, run.explain()
        assert "ConnectionError" not in o.message.split("\n", 1)[0], o.message
        assert o.seconds < 15, f"{name} took {o.seconds:.1f} s: it waited on something"
    assert reap(mark) == []


INNER_KILL_SCHEDULER = '''
import os
import signal

import psutil


def test_1_kill_the_scheduler(sglang_server):
    ranks = [p for p in psutil.Process(sglang_server.pid).children(recursive=True)
             if p.cmdline() and p.cmdline()[0].startswith("sglang::scheduler")]
    assert ranks, "no sglang::scheduler process in the server's tree"
    os.kill(ranks[0].pid, signal.SIGKILL)


def test_2_after_the_kill(sglang_server):
    pass
'''


# A launch of its own (115 s on this shared 2-core VM): past the CI budget, so run on demand with
# PYTEST_SGLANG_KILL_CHECK=1. The order the GPU host showed is reproduced in CI by tests/launch/test_tree_members.py.
@pytest.mark.skipif(not os.environ.get("PYTEST_SGLANG_KILL_CHECK"),
                    reason="its own SGLang launch: set PYTEST_SGLANG_KILL_CHECK=1 to run it")
def test_sglang_scheduler_killed_mid_session_is_named_first(tmp_path: Path, tiny_models: TinyModels,
                                                            mark: str) -> None:
    """SGLang's launcher then kills the rest of its tree, helpers without a role among them: the scheduler is
    still the one named first."""
    python = server_python("sglang")
    project = InnerProject(tmp_path, mark)
    project.write("profiles.toml", profile_toml("sglang-kill", "sglang", python=python,
                                                model=tiny_models.get("ok", python), mark=mark))
    project.write("test_inner.py", INNER_KILL_SCHEDULER)
    run = project.run("--sglang-profile=sglang-kill", tag="kill")
    assert run.outcome("test_1_kill_the_scheduler").outcome == "passed", run.explain()
    after = run.outcome("test_2_after_the_kill")
    assert after.outcome == "failed", run.explain()
    first = re.search(r"(?:tree to die|of its tree died): (\S+) \(pid \d+\)", after.message)
    assert first is not None and first.group(1).startswith("sglang::scheduler"), after.message
    assert reap(mark) == []


def test_no_server_process_left_at_all(tiny_models: TinyModels) -> None:
    """Belt and braces after the module: no process serves any of this session's tiny models."""
    import psutil

    root = str(tiny_models.root)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if root in cmd:
            left.append(f"{p.pid} {cmd[:160]}")
    assert left == []
