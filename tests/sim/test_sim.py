"""The SGLang simulator as a real process tree over real HTTP: startup log, endpoints, pacing, faults."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
import requests
from helpers import die_with_pytest
from simtools import Sim, alive, free_port, sse_events

from pytest_sglang.sim.engine import WORDS

Launch = Callable[..., Sim]

STAMP = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\]"
STAMP_TP = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} TP(\d)\]"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


# -- startup ---------------------------------------------------------------------------------------

def test_startup_log_order_timing_and_health(launch: Launch) -> None:
    S = 1.5
    sim = launch({"startup_seconds": S})
    statuses: list[int] = []
    markers = [
        r"server_args=ServerArgs\(model_path='sim/tiny'",
        r"Init torch distributed begin\.",
        r"Load weight begin\. avail mem=78\.58 GB",
        r"Loading safetensors checkpoint shards:  50% Completed \| 32/64",
        r"Load weight end\. type=LlamaForCausalLM, dtype=torch\.bfloat16",
        r"KV Cache is allocated\. #tokens: 834615, K size: 54\.12 GB, V size: 54\.12 GB",
        r"Capture cuda graph begin\. This can take up to several minutes\.",
        r"Capturing batches \(bs=1 avail_mem=[\d.]+ GB\): 100%\|.*\| 52/52",
        r"Capture cuda graph end\. Time elapsed: [\d.]+ s\.",
        r"max_total_num_tokens=\d+",
        r"INFO:     Started server process \[\d+\]",
        r"INFO:     Waiting for application startup\.",
        r"INFO:     Application startup complete\.",
        rf"INFO:     Uvicorn running on http://127\.0\.0\.1:{sim.port} \(Press CTRL\+C to quit\)",
        r'INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK',
        r'INFO:     127\.0\.0\.1:\d+ - "POST /generate HTTP/1\.1" 200 OK',
        r"The server is fired up and ready to roll!",
    ]
    # Poll /health while watching the log: 503 (or refused) first, 200 only once the ready line is out.
    seen_at: dict[str, float] = {}
    deadline = time.monotonic() + S + 10
    while len(seen_at) < len(markers) and time.monotonic() < deadline:
        text = sim.text()
        for m in markers:
            if m not in seen_at and re.search(m, text):
                seen_at[m] = time.monotonic() - sim.launched
        try:
            code = requests.get(sim.base + "/health", timeout=2).status_code
            if code == 200:
                assert re.search(markers[-1], sim.text()), "/health said 200 before the ready line"
            statuses.append(code)
        except requests.ConnectionError:
            pass
        time.sleep(0.01)
    assert len(seen_at) == len(markers), [m for m in markers if m not in seen_at]
    text = sim.text()
    positions = [re.search(m, text).start() for m in markers]  # type: ignore[union-attr]
    assert positions == sorted(positions), "startup lines out of SGLang's order"
    ready = seen_at[markers[-1]]
    assert S * 0.85 <= ready <= S + 1.0, f"ready after {ready:.2f} s, startup_seconds={S}"
    # Paced, not dumped at once: CUDA graph capture starts around the middle of the startup (children start
    # late on a loaded machine, so allow their first lines to be late and bunched).
    assert 0.35 * S < seen_at[markers[6]] < 0.9 * S < ready
    assert 503 in statuses
    assert sim.get("/health").status_code == 200
    # Format: no rank prefix at tp=1; the shard bar is one line of \r-separated updates.
    for line in text.splitlines():
        if line.startswith("["):
            assert re.match(STAMP + " ", line), line
    bar_line = next(line for line in text.split("\n") if "Loading safetensors checkpoint shards" in line)
    assert bar_line.startswith("\r") and bar_line.count("\r") >= 5
    assert "100% Completed | 64/64" in bar_line


def test_tp2_speculative_tree_prefixes_and_spec_figures(launch: Launch) -> None:
    sim = launch({"startup_seconds": 0.8, "max_batch": 2, "decode_tok_s": 100, "accept_length": 3.2},
                 "--tp", "2", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
                 "--mem-fraction-static", "0.8", "--enable-metrics")
    sim.wait_ready()
    kids = sim.note_tree()
    cmdlines = sorted(" ".join(k.cmdline()) for k in kids)
    assert len(kids) == 3, cmdlines
    assert sum("scheduler_TP0" in c for c in cmdlines) == 1
    assert sum("scheduler_TP1" in c for c in cmdlines) == 1
    assert sum("detokenizer" in c for c in cmdlines) == 1
    text = sim.text()
    for rank in (0, 1):
        assert re.search(rf"^\[\S+ \S+ TP{rank}\] Load weight begin\.", text, re.M)
        assert len(re.findall(rf"^\[\S+ \S+ TP{rank}\] Load weight end\.", text, re.M)) == 2
        assert len(re.findall(rf"^\[\S+ \S+ TP{rank}\] KV Cache is allocated\.", text, re.M)) == 2
        for what in ("Capture draft cuda graph", "Capture draft extend cuda graph"):
            assert re.search(rf"^\[\S+ \S+ TP{rank}\] {what} begin\.", text, re.M)
            assert re.search(rf"^\[\S+ \S+ TP{rank}\] {what} end\. Time elapsed", text, re.M)
    assert re.search(STAMP + r" The server is fired up", text)
    assert not re.search(r"TP\d\] (?:Loading|Capturing)", text)  # tqdm bars carry no prefix

    info = sim.get("/server_info").json()
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(3.2)
    assert info["tp_size"] == 2 and info["speculative_algorithm"] == "EAGLE3"
    gen = sim.post("/generate", {"text": "a b", "sampling_params": {"max_new_tokens": 32}}).json()
    meta = gen["meta_info"]
    assert meta["completion_tokens"] == 32
    assert meta["spec_verify_ct"] == 10  # ceil(32 / 3.2)
    with sim.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 32},
                                "stream": True}, stream=True) as r:
        events = [d for _, d in sse_events(r)]
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) < 32 and sum(len(c["output_ids"]) for c in chunks) == 32
    assert chunks[-1]["meta_info"]["spec_verify_ct"] == len(chunks)

    # max_batch=2: four 40-token requests at 100 tok/s run two at a time.
    done: list[float] = []
    t0 = time.monotonic()

    def one() -> None:
        sim.post("/generate", {"text": "q", "sampling_params": {"max_new_tokens": 40}})
        done.append(time.monotonic() - t0)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    one_req = 0.02 + 39 / 100
    done.sort()
    assert done[1] < 1.5 * one_req and done[3] > 1.8 * one_req, done


# -- endpoints -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One ready server (api key on, 50 tok/s, TTFT 20 ms) shared by the endpoint and pacing tests."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("served") / "sim.log"
    env = dict(os.environ, PYTEST_SGLANG_SIM='{"startup_seconds": 0.5, "decode_tok_s": 50, "ttft_ms": 20}')
    with open(log_path, "wb") as log:
        launched = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pytest_sglang.sim", "--model-path", "org/model",
                                 "--port", str(port), "--api-key", KEY, "--served-model-name", "served-name"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=die_with_pytest())
    sim = Sim(proc, log_path, port, launched)
    try:
        sim.wait_ready()
        yield sim
    finally:
        sim.kill_all()
    assert not any(alive(p) for p in sim.seen.values())


def test_auth_and_info_endpoints(served: Sim) -> None:
    s = served
    assert s.get("/health").status_code == 200  # /health needs no key
    assert s.get("/model_info").status_code == 401
    assert s.get("/model_info").json() == {"error": "Unauthorized"}
    assert s.post("/generate", {"text": "x"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    for path in ("/model_info", "/get_model_info"):
        mi = s.get(path, headers=AUTH).json()
        assert mi["model_path"] == "org/model" and mi["tokenizer_path"] == "org/model"
        assert mi["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        si = s.get(path, headers=AUTH).json()
        assert si["version"] == "0.0.0-sim" and si["model_path"] == "org/model"
        assert "avg_spec_accept_length" not in si["internal_states"][0]
    assert s.get("/health_generate").status_code == 200
    fl = requests.post(s.base + "/flush_cache", headers=AUTH, timeout=5)
    assert fl.status_code == 200 and fl.text.startswith("Cache flushed.")
    models = s.get("/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == "served-name"
    assert s.get("/nope", headers=AUTH).status_code == 404


def test_openai_completions(served: Sim) -> None:
    s = served
    body = {"model": "served-name", "prompt": "one two three", "max_tokens": 5, "temperature": 0}
    a = s.post("/v1/completions", body, headers=AUTH).json()
    b = s.post("/v1/completions", body, headers=AUTH).json()
    assert a["object"] == "text_completion" and a["model"] == "served-name"
    assert a["choices"][0]["text"] == b["choices"][0]["text"]  # deterministic
    assert len(a["choices"][0]["text"].split()) == 5 and a["choices"][0]["finish_reason"] == "length"
    assert a["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    ids = s.post("/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 3}, headers=AUTH).json()
    assert ids["usage"]["prompt_tokens"] == 4 and ids["usage"]["completion_tokens"] == 3
    default = s.post("/v1/completions", {"prompt": "x"}, headers=AUTH).json()
    assert default["usage"]["completion_tokens"] == 16

    with s.post("/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}),
                headers=AUTH, stream=True) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [d for _, d in sse_events(r)]
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    content = events[:-2]
    assert len(content) == 5 and content[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in content) == a["choices"][0]["text"]
    with s.post("/v1/completions", dict(body, stream=True), headers=AUTH, stream=True) as r:
        plain = [d for _, d in sse_events(r)]
    assert len(plain) == 6 and all(e == "[DONE]" or not e.get("usage") for e in plain)


def test_openai_chat(served: Sim) -> None:
    s = served
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
            "max_tokens": 4}
    r = s.post("/v1/chat/completions", body, headers=AUTH).json()
    assert r["object"] == "chat.completion"
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and len(msg["content"].split()) == 4
    assert r["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    with s.post("/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True}),
                headers=AUTH, stream=True) as resp:
        events = [d for _, d in sse_events(resp)]
    assert events[-1] == "[DONE]" and events[-2]["usage"]["total_tokens"] == 8
    deltas = [e["choices"][0]["delta"] for e in events[:-2]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d["content"] for d in deltas) == msg["content"]


def test_native_generate(served: Sim) -> None:
    s = served
    with requests.Session() as sess:  # keep-alive: several requests over one connection
        sess.headers.update(AUTH)
        req = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        r1 = sess.post(s.base + "/generate", json=req)
        r2 = sess.post(s.base + "/generate", json=req)
    out = r1.json()
    assert r2.json()["meta_info"]["cached_tokens"] == 2  # the same prompt again: all but its last token, as SGLang
    assert out == {**r2.json(), "meta_info": {**r2.json()["meta_info"], "id": out["meta_info"]["id"],
                                              "e2e_latency": out["meta_info"]["e2e_latency"],
                                              "cached_tokens": out["meta_info"]["cached_tokens"]}}
    assert len(out["output_ids"]) == 6 and len(out["text"].split()) == 6
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert 0.1 < meta["e2e_latency"] < 1.0 and "spec_verify_ct" not in meta
    text = s.post("/generate", {"text": "The capital city of France is", "sampling_params": {}},
                  headers=AUTH).json()
    assert text["meta_info"]["prompt_tokens"] == 6 and text["meta_info"]["completion_tokens"] == 16
    batch = s.post("/generate", {"text": ["a", "b c"], "sampling_params": {"max_new_tokens": 2}},
                   headers=AUTH).json()
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [1, 2]
    with s.post("/generate", {"text": "a b", "sampling_params": {"max_new_tokens": 5}, "stream": True},
                headers=AUTH, stream=True) as r:
        events = [d for _, d in sse_events(r)]
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [len(c["output_ids"]) for c in chunks] == [1] * 5  # incremental ids
    assert [len(c["text"].split()) for c in chunks] == [1, 2, 3, 4, 5]  # cumulative text
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert s.post("/generate", {"sampling_params": {}}, headers=AUTH).status_code == 400


def test_logprobs_native_and_openai(served: Sim) -> None:
    """SGLang's return_logprob/top_logprobs_num and the completions logprobs field (vLLM's token_id names),
    capped at the simulator's vocabulary of words; a bad count is answered 400 before any work."""
    s = served
    req = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}, "return_logprob": True,
           "top_logprobs_num": 2}
    out = s.post("/generate", req, headers=AUTH).json()
    top = out["meta_info"]["output_top_logprobs"]
    assert [[c[1] for c in pos][0] for pos in top] == out["output_ids"]  # greedy: its own token leads
    assert all(len(pos) == 2 and pos[0][0] - pos[1][0] == pytest.approx(4.0) for pos in top)  # output_margin
    assert [e[1] for e in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
    many = s.post("/generate", dict(req, top_logprobs_num=500), headers=AUTH).json()
    assert all(len(pos) == len(WORDS) for pos in many["meta_info"]["output_top_logprobs"])
    body = {"prompt": [5, 6], "max_tokens": 2, "logprobs": 3, "return_tokens_as_token_ids": True}
    choice = s.post("/v1/completions", body, headers=AUTH).json()["choices"][0]
    assert all(len(p) == 3 and all(k.startswith("token_id:") for k in p) for p in choice["logprobs"]["top_logprobs"])
    assert choice["logprobs"]["text_offset"] == [0, len(" " + choice["text"].split()[0])]
    assert s.post("/generate", dict(req, top_logprobs_num=-1), headers=AUTH).status_code == 400
    assert s.post("/v1/completions", dict(body, logprobs="x"), headers=AUTH).status_code == 400


# -- pacing ----------------------------------------------------------------------------------------

def _stream_rate(s: Sim, n: int) -> tuple[float, float]:
    """(tok/s after the first token, TTFT seconds) of one streamed /v1/completions request."""
    t0 = time.monotonic()
    with s.post("/v1/completions", {"prompt": "pace", "max_tokens": n, "stream": True}, headers=AUTH,
                stream=True) as r:
        events = sse_events(r)
    times = [t for t, d in events if d != "[DONE]"]
    assert len(times) == n
    return (n - 1) / (times[-1] - times[0]), times[0] - t0


# The simulator paces each token to a deadline of its own (sim/engine.py), so its pace holds however late one
# token leaves; the client's clock is what a loaded runner delays. A pacing fault (a shared pace, a lost
# deadline) shows in every round; a stall of the client's machine in one: a check passes in the first of
# PACING_ROUNDS rounds that meets it, and fails naming every round's figure.
PACING_ROUNDS = 3


def test_pacing_single_stream(served: Sim) -> None:
    seen = []
    for _ in range(PACING_ROUNDS):
        rate, ttft = _stream_rate(served, 81)  # 1.6 s at 50 tok/s
        seen.append(f"{rate:.2f} tok/s, TTFT {ttft * 1e3:.0f} ms")
        assert ttft > 0.015, "the first token left before ttft_ms"  # a deadline is never early, loaded or not
        if rate == pytest.approx(50.0, rel=0.03) and ttft < 0.06:
            return
    pytest.fail(f"no round paced at 50 tok/s (3%) with a TTFT of 20 ms (< 60 ms): {'; '.join(seen)}")


def _concurrent_rates(served: Sim, streams: int, tokens: int) -> list[float]:
    rates: list[float] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            rates.append(_stream_rate(served, tokens)[0])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(rates) == streams
    return rates


def test_pacing_32_concurrent_streams(served: Sim) -> None:
    seen = []
    for _ in range(PACING_ROUNDS):
        rates = _concurrent_rates(served, 32, 61)
        worst = max(abs(r - 50.0) / 50.0 for r in rates)
        if worst < 0.03:
            return
        seen.append(f"worst stream off by {worst:.1%}, median {statistics.median(rates):.2f} tok/s")
    pytest.fail(f"in no round were all 32 streams within 3% of 50 tok/s: {'; '.join(seen)}")


# -- faults ----------------------------------------------------------------------------------------

def test_fault_traceback_parent_stays_alive(launch: Launch) -> None:
    sim = launch({"startup_seconds": 1.0, "fault": "traceback", "fault_after": 0.4}, "--tp", "2")
    sim.wait_for(r"^AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute")
    text = sim.text()
    assert re.search(STAMP_TP.replace(r"(\d)", "1") + r" Scheduler hit an exception: Traceback \(most recent",
                     text)
    assert re.search(r'^  File ".*/sglang/srt/managers/scheduler\.py", line 2937, in run_scheduler_process$',
                     text, re.M)
    time.sleep(0.8)
    assert sim.proc.poll() is None, "parent must hang on, silent"
    assert "ready to roll" not in sim.text() and "sigquit" not in sim.text()
    names = [" ".join(p.cmdline()) for p in psutil.Process(sim.proc.pid).children() if alive(p)]
    assert not any("scheduler_TP1" in n for n in names) and any("scheduler_TP0" in n for n in names)
    assert sim.get("/health").status_code == 503


def test_fault_exit_kills_tree(launch: Launch) -> None:
    sim = launch({"startup_seconds": 1.0, "fault": "exit"})
    sim.wait_for(r"Init torch distributed begin")  # the tree as it was, so we can check it is gone
    assert sim.proc.wait(10) == -signal.SIGKILL
    text = sim.text()
    tb = text.index("Scheduler hit an exception: Traceback (most recent call last):")
    quit_ = text.index("Received sigquit from a child process. It usually means the child failed.")
    assert tb < text.index("AttributeError: ") < quit_
    assert re.search(STAMP + r" Scheduler hit an exception", text)  # tp=1: no prefix
    assert re.search(STAMP + r" Received sigquit", text)
    time.sleep(0.2)
    assert sim.seen and not any(alive(p) for p in sim.seen.values())


def test_fault_hang_stops_logging(launch: Launch) -> None:
    sim = launch({"startup_seconds": 1.0, "fault": "hang", "fault_after": 0.04})
    sim.wait_for(r"Init torch distributed begin\.")
    time.sleep(1.2)
    text = sim.text()
    assert text.rstrip().endswith("Init torch distributed begin.")
    assert sim.proc.poll() is None and len(sim.note_tree()) == 2
    assert sim.get("/health").status_code == 503


def test_fault_bad_flag(launch: Launch) -> None:
    sim = launch({"fault": "bad-flag"}, "--foo", "1")
    assert sim.proc.wait(10) == 2
    text = sim.text()
    assert text.startswith("usage: sglang serve")
    assert "sglang serve: error: unrecognized arguments: --foo 1" in text
    assert "Traceback" not in text
    sim2 = launch({"fault": "bad-flag"})
    assert sim2.proc.wait(10) == 2
    assert "sglang serve: error: unrecognized arguments: --bad-flag" in sim2.text()


def test_bad_knobs_are_reported(launch: Launch) -> None:
    sim = launch({"startup_secs": 1})
    assert sim.proc.wait(10) == 2
    assert "unknown knob(s) startup_secs" in sim.text()


def test_crash_after_requests_mid_session(launch: Launch) -> None:
    sim = launch({"startup_seconds": 0.5, "crash_after_requests": 2, "decode_tok_s": 200}, "--tp", "2")
    sim.wait_ready()
    for _ in range(2):
        r = sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200
    assert sim.proc.wait(10) == -signal.SIGKILL
    text = sim.text()
    assert re.search(r"\[\S+ \S+ TP1\] Scheduler hit an exception: Traceback", text)
    assert text.index("RuntimeError: CUDA error: an illegal memory access") < text.index(
        "Received sigquit from a child process")
    time.sleep(0.2)
    assert not any(alive(p) for p in sim.seen.values())


# -- signals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_graceful_shutdown(launch: Launch, sig: signal.Signals) -> None:
    sim = launch({"startup_seconds": 0.4}, "--tp", "2")
    sim.wait_ready()
    kids = sim.note_tree()
    assert len(kids) == 3
    sim.proc.send_signal(sig)
    assert sim.proc.wait(10) == 0
    gone, alive_ = psutil.wait_procs(kids, timeout=5)
    assert not alive_
    assert "INFO:     Finished server process" in sim.text()


def test_ignore_sigterm_children_escape(launch: Launch) -> None:
    sim = launch({"startup_seconds": 0.4, "ignore_sigterm": True}, "--tp", "2")
    sim.wait_ready()
    kids = sim.note_tree()
    assert len(kids) == 3
    assert all(os.getsid(k.pid) != os.getsid(sim.proc.pid) for k in kids)  # each in its own session
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(10) == 0
    time.sleep(0.5)
    assert all(alive(k) for k in kids), "escaped children must survive SIGTERM and their parent"
    # the launch fixture's teardown kills them (and asserts none is left)


def test_children_die_with_a_killed_parent(launch: Launch) -> None:
    sim = launch({"startup_seconds": 0.4})
    sim.wait_ready()
    kids = sim.note_tree()
    os.kill(sim.proc.pid, signal.SIGKILL)  # only the parent, not the group
    sim.proc.wait(5)
    _, left = psutil.wait_procs(kids, timeout=5)
    assert not left
