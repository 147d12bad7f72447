"""What a user writes: the server is up, it answers, and its startup looks right."""

import pytest
import requests


def started_by_this_run(server):
    """Under --sglang-url the server was already running: it has no startup to look at."""
    if server.startup_seconds is None:
        pytest.skip("this run did not start the server (--sglang-url): no startup to check")


def test_startup_within_bound(sglang_server):
    started_by_this_run(sglang_server)
    # The seeds' real startups took 555-580 s; fail loudly if a change makes it much slower.
    assert sglang_server.startup_seconds < 900


def test_startup_phases_present(sglang_server):
    started_by_this_run(sglang_server)
    phases = sglang_server.phases
    for phase in ("load_weights", "kv_cache", "cuda_graph", "ready"):
        assert phase in phases, f"phase {phase} missing from {sorted(phases)}"
    # Phases are when the watcher read each line: two lines written in one burst can share a timestamp.
    assert phases["load_weights"] <= phases["kv_cache"] <= phases["ready"]


def test_completion_answers(sglang_server):
    resp = requests.post(
        sglang_server.url("/v1/completions"),
        json={"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
        headers=sglang_server.headers,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 8


def test_native_generate_reports_tokens(sglang_server):
    resp = requests.post(
        sglang_server.url("/generate"),
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}},
        headers=sglang_server.headers,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["completion_tokens"] == 4
