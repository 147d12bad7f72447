"""LogWatcher: readiness, phases, progress, fail-fast signal and the Diagnosis it hands to the error."""

from __future__ import annotations

from pathlib import Path

from pytest_sglang.config.kinds import GENERIC, SGLANG, VLLM
from pytest_sglang.errors import Diagnosis
from pytest_sglang.watch import LogTail, LogWatcher, Progress, extract_root_causes

T0 = 1000.0


def test_phases_progress_status_and_ready() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    assert w.status(T0) == "starting"
    w.feed(["[2025-10-16 09:06:09 TP0] Init torch distributed begin."], T0 + 1)
    assert w.status(T0 + 1) == "initialising torch distributed"
    w.feed(["[2025-10-16 09:06:10 TP0] Load weight begin. avail mem=78.58 GB",
            "[2025-10-16 09:06:10 TP1] Load weight begin. avail mem=78.58 GB"], T0 + 2)
    w.feed(["Loading safetensors checkpoint shards:  75% Completed | 48/64 [01:02<00:20,  1.1it/s]"], T0 + 30)
    assert w.progress == Progress("Loading safetensors checkpoint shards", 75, 48, 64)
    assert w.status(T0 + 31) == "loading weights 75% (48/64 shards)"
    w.feed(["[2025-10-16 09:07:10 TP0] KV Cache is allocated. #tokens: 834615, K size: 54.12 GB",
            "[2025-10-16 09:07:11 TP0] Capture cuda graph begin. This can take up to several minutes."], T0 + 40)
    assert w.status(T0 + 41) == "capturing CUDA graphs"  # the bar belongs to an earlier phase
    w.feed(["[2025-10-16 09:07:11 TP0] Load weight begin. avail mem=10 GB"], T0 + 42)  # draft model: ignored
    w.feed(["[2026-02-04 11:30:31] INFO:     Application startup complete.",
            "[2026-02-04 11:30:31] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"],
           T0 + 50)
    assert w.ready_at is None  # uvicorn is not readiness for SGLang
    w.feed(['[2026-02-04 11:30:32] INFO:     127.0.0.1:56852 - "GET /get_model_info HTTP/1.1" 200 OK'], T0 + 51)
    w.feed(["[2026-02-04 11:30:33] The server is fired up and ready to roll!"], T0 + 52.5)
    assert w.ready_at == T0 + 52.5
    assert w.phases == {
        "init_distributed": 1.0, "load_weights": 2.0, "kv_cache": 40.0, "cuda_graph": 40.0,
        "http_up": 50.0, "warmup": 51.0,  # "ready" is the readiness loop's, not the watcher's
    }
    assert w.failing_since is None
    assert w.status(T0 + 60) == "ready line logged"


def test_after_the_ready_line_only_a_crash_is_looked_for(tmp_path: Path) -> None:
    """Phases and shard progress end at the ready line ("ready" is the last phase); the serving log after it is
    read for a crash alone, so its decode and access lines are passed over for fewer literals."""
    log = tmp_path / "server.log"
    log.write_text("[2026-02-04 11:30:33] The server is fired up and ready to roll!\n")
    w = LogWatcher(SGLANG, started_at=T0, tail=LogTail(log))
    w.poll(T0 + 1)
    assert w.ready_at == T0 + 1
    with log.open("a") as f:
        f.write("[2026-02-04 11:30:34 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
                "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.1it/s]\n"
                '[2026-02-04 11:30:35] INFO:     127.0.0.1:56852 - "POST /generate HTTP/1.1" 200 OK\n')
    w.poll(T0 + 2)
    assert w.phases == {} and w.progress is None
    assert w._every is not None and not {b" graph begin", b"oading", b'"POST /generate HTTP'} & w._every.encoded
    with log.open("a") as f:
        f.write("[2026-02-04 11:30:36 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
                '  File "/sgl/scheduler.py", line 1, in run\nRuntimeError: CUDA error: out of memory\n'
                "[2026-02-04 11:30:37] Received sigquit from a child process. It usually means the child failed.\n")
    w.poll(T0 + 3)
    assert w.failing_since is not None
    assert w.root_causes()[0].startswith("RuntimeError: CUDA error: out of memory\n(raised on TP0)")


def test_status_notes_silence() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(["[2025-09-01 05:58:12 TP0] Init torch distributed begin."], T0 + 1)
    assert "no log output for 300 s" in w.status(T0 + 301)


def test_ready_pattern_override_and_vllm_ready() -> None:
    w = LogWatcher(SGLANG, ready_pattern=r"READY on port \d+", started_at=T0)
    w.feed(["[2026-02-04 11:30:33] The server is fired up and ready to roll!"], T0 + 1)
    assert w.ready_at is None
    w.feed(["READY on port 8000"], T0 + 2)
    assert w.ready_at == T0 + 2

    v = LogWatcher(VLLM, started_at=T0)
    v.feed(["(APIServer pid=1) INFO 06-14 04:58:29 [launcher.py:46] Available routes are:"], T0 + 3)
    v.feed(["(APIServer pid=1) INFO:     Application startup complete."], T0 + 4)
    assert v.ready_at == T0 + 4
    assert v.phases["http_up"] == 3.0


def test_kind_without_ready_pattern_never_ready_from_log() -> None:
    w = LogWatcher(GENERIC, started_at=T0)
    w.feed(["INFO:     Uvicorn running on http://0.0.0.0:8080", "The server is fired up and ready to roll!"], T0 + 1)
    assert w.ready_at is None
    assert w.phases == {"http_up": 1.0}


def test_failing_since_is_the_end_of_the_traceback() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(["[2026-01-25 01:19:08 TP1] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/py/scheduler.py", line 2937, in run_scheduler_process',
            "    scheduler = Scheduler("], T0 + 5)
    assert w.failing_since is None  # a traceback in progress is not yet a cause
    w.feed(["RuntimeError: start (8) + length (8) exceeds dimension size (8)."], T0 + 6)
    assert w.failing_since == T0 + 6
    w.feed(["", "[2026-01-25 01:19:08] Received sigquit from a child process. It usually means the child failed."],
           T0 + 6.2)
    assert w.failing_since == T0 + 6  # first evidence only
    d = w.diagnosis(exit_code=-9)
    assert isinstance(d, Diagnosis)
    assert d.exit_code == -9
    assert d.root_causes[0].splitlines()[0] == "RuntimeError: start (8) + length (8) exceeds dimension size (8)."
    assert d.last_lines[-1].endswith("It usually means the child failed.")
    assert w.status(T0 + 7).startswith("failing: RuntimeError: start (8)")


def test_fatal_marker_without_traceback_fails_fast() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(["[2025-09-01 05:58:12 TP0] Load weight begin. avail mem=1 GB"], T0 + 1)
    w.feed(["[2026-03-13 14:24:23] Received sigquit from a child process. It usually means the child failed."],
           T0 + 9)
    assert w.failing_since == T0 + 9
    assert w.diagnosis().root_causes == [
        "Received sigquit from a child process. It usually means the child failed."
    ]
    assert w.diagnosis().phase == "loading weights"


def test_warnings_and_benign_tracebacks_do_not_fail_startup() -> None:
    w = LogWatcher(VLLM, started_at=T0)
    w.feed([
        "(APIServer pid=1) WARNING 06-14 04:58:29 [x.py:1] Optional plugin unavailable: Traceback "
        "(most recent call last):",
        '(APIServer pid=1) WARNING 06-14 04:58:29 [x.py:1]   File "/v/plugins.py", line 3, in load',
        "(APIServer pid=1) WARNING 06-14 04:58:29 [x.py:1]     import fancy",
        "(APIServer pid=1) WARNING 06-14 04:58:29 [x.py:1] ModuleNotFoundError: No module named 'fancy'",
        "(APIServer pid=1) INFO 06-14 04:58:29 [x.py:1] Ignore import error when loading foo: nope",
        "(APIServer pid=1) INFO 06-14 04:58:29 [x.py:1] error_count=0",
    ], T0 + 1)
    assert w.failing_since is None
    # still available if the server later dies without saying more
    assert w.diagnosis().root_causes[0].startswith("ModuleNotFoundError: No module named 'fancy'")


def test_last_lines_ring_buffer() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed([f"line {i}" for i in range(1000)], T0 + 1)
    assert w.diagnosis().last_lines == [f"line {i}" for i in range(970, 1000)]


def test_huge_lines_fed_directly_are_capped() -> None:
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(["x" * 1_000_000, "KeyError: '" + "k" * 1_000_000 + "'"], T0 + 1)
    d = w.diagnosis()
    assert all(len(line) <= 8192 for line in d.last_lines)
    assert all(len(block) <= 9000 for block in d.root_causes)


def test_tail_and_watcher_together_on_a_growing_file(tmp_path: Path) -> None:
    """What the readiness loop does: read new lines, feed, and flush once the process has exited."""
    log = tmp_path / "server.log"
    tail = LogTail(log)
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(tail.read_lines(), T0)  # not created yet
    chunks = [
        b"[2025-03-08 12:29:13 TP0] Load weight begin. avail mem=21.63 GB\n",
        b"Loading safetensors checkpoint shards:   0% Completed | 0/14 [00:00<?, ?it/s]\r",
        b"Loading safetensors checkpoint shards:  50% Completed | 7/14 [00:03<00:04,  1.74it/s]\r",
        b"[2025-03-08 12:29:21 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        b'  File "/py/x.py", line 1, in f\n    g()\n',
        b"safetensors._safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncomple",
        b"teBuffer",  # no newline: the process died mid-line
    ]
    for i, chunk in enumerate(chunks):
        with open(log, "ab") as f:
            f.write(chunk)
        w.feed(tail.read_lines(), T0 + i + 1)
        if i == 2:
            assert w.status(T0 + 3) == "loading weights 50% (7/14 shards)"
    assert w.failing_since is None
    w.feed(tail.flush(), T0 + 10)
    assert w.failing_since == T0 + 10
    assert w.diagnosis(1).root_causes[0].splitlines()[0] == (
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"
    )


def test_extract_matches_watcher() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/a.py", line 1, in f',
        "    x = d[k]",
        "KeyError: 'k'",
    ]
    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(lines, T0)
    assert w.diagnosis().root_causes == extract_root_causes(lines)


def test_reversed_chain() -> None:
    forward = [
        "Traceback (most recent call last):",
        'File "/a.py", line 1, in f',
        "x = d[k]",
        "KeyError: 'k'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        'File "/b.py", line 2, in g',
        'raise ValueError("bad k")',
        "ValueError: bad k",
    ]
    for lines in (forward, list(reversed(forward))):
        causes = extract_root_causes(lines)
        assert len(causes) == 1
        assert causes[0].splitlines()[:2] == ["ValueError: bad k", "caused by: KeyError: 'k'"]


def test_the_probes_own_access_lines_are_not_progress(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    w = LogWatcher(SGLANG, started_at=T0, tail=LogTail(log))
    w.ignore_requests(["/health_generate", "health"])
    probe = b'[2025-03-08 12:29:13] INFO:     127.0.0.1:5544 - "GET /health HTTP/1.1" 404 Not Found\n'
    other = b'[2025-03-08 12:29:13] INFO:     127.0.0.1:5544 - "GET /v1/models HTTP/1.1" 200 OK\n'
    with open(log, "ab") as f:
        for at, chunk in [(T0 + 1, b"[2025-03-08 12:29:13 TP0] Load weight begin.\n"), (T0 + 2, probe * 3),
                          (T0 + 3, probe.replace(b"/health", b"/health_generate?x=1")), (T0 + 4, other),
                          (T0 + 5, probe + b"[2025-03-08 12:29:14 TP0] KV Cache is allocated.\n")]:
            f.write(chunk)
            f.flush()
            w.poll(at)
            assert w.last_line_at == {T0 + 2: T0 + 1, T0 + 3: T0 + 1}.get(at, at), at
        w.ignore_requests(())
        f.write(probe)
        f.flush()
        w.poll(T0 + 6)
    assert w.last_line_at == T0 + 6


def test_a_killed_process_is_the_cause_where_the_server_logged_only_its_reaction() -> None:
    """SGLang's scheduler SIGKILLed: its launcher logs "Received sigquit from a child process" and no exception.
    That line is SGLang's reaction; the process that died first, and how, is the cause the error leads with."""
    from pytest_sglang.errors import ServerDiedError

    w = LogWatcher(SGLANG, started_at=T0)
    w.feed(["[2026-12-02 10:00:00] The server is fired up and ready to roll!",
            "[2026-12-02 10:00:09] Received sigquit from a child process. It usually means the child failed."], T0 + 9)
    diagnosis = w.diagnosis(exit_code=-9)
    assert diagnosis.reaction_only
    diagnosis.died_first = "sglang::scheduler_TP0 (pid 41): killed by SIGKILL (exit code 137), noticed 9.1 s later"
    error = ServerDiedError("server died during the session", profile="p", log_path=None, diagnosis=diagnosis)
    first, *rest = str(error).splitlines()
    assert first.startswith("[sglang p] server died during the session: sglang::scheduler_TP0 (pid 41): killed by "
                            "SIGKILL")
    assert "What the server logged of it:" in rest
    assert any("Received sigquit from a child process" in line for line in rest)
    assert not any(line.startswith("First process of the server's tree to die") for line in rest)

    crashed = LogWatcher(SGLANG, started_at=T0)  # a real exception stays the cause, the first death beside it
    crashed.feed(["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                  "RuntimeError: CUDA error: out of memory", "Received sigquit from a child process."], T0 + 1)
    told = crashed.diagnosis()
    told.died_first = "sglang::scheduler_TP0 (pid 41): exit code 1"
    assert not told.reaction_only
    error = ServerDiedError("server died during the session", profile="p", log_path=None, diagnosis=told)
    assert error.cause == "RuntimeError: CUDA error: out of memory"
    assert "First process of the server's tree to die: sglang::scheduler_TP0" in str(error)
