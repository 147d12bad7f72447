"""Root-cause extraction on synthetic logs: each case is one way real logs go wrong."""

from __future__ import annotations

from pytest_sglang.config.kinds import SGLANG, VLLM
from pytest_sglang.watch import extract_root_causes, strip_prefixes


def _lines(text: str) -> list[str]:
    return text.strip("\n").split("\n")


def _headlines(causes: list[str]) -> list[str]:
    return [block.splitlines()[0] for block in causes]


SGL_TB = """\
[2026-01-25 01:19:08 {rank}] Scheduler hit an exception: Traceback (most recent call last):
  File "/py/sglang/srt/managers/scheduler.py", line 2937, in run_scheduler_process
    scheduler = Scheduler(
                ^^^^^^^^^^
  File "/py/sglang/srt/model_executor/model_runner.py", line 889, in load_model
    self.model = self.loader.load_model(
                 ^^^^^^^^^^^^^^^^^^^^^^^
  File "/py/sglang/srt/models/kimi.py", line 42, in __init__
    self.set_eagle3_layers_to_capture()
    ~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'
"""


def test_prefixed_header_headline_and_frames() -> None:
    causes = extract_root_causes(_lines(SGL_TB.format(rank="TP0")))
    assert len(causes) == 1
    block = causes[0].splitlines()
    assert block[0] == (
        "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'"
    )
    assert block[1] == "(raised on TP0)"
    assert block[2] == '  File "/py/sglang/srt/managers/scheduler.py", line 2937, in run_scheduler_process'
    assert block[3] == "    scheduler = Scheduler("
    assert block[-1] == "    self.set_eagle3_layers_to_capture()"
    # caret lines are dropped
    assert not any(set(line.strip()) <= set("^~") for line in block)


def test_tp_ranks_deduplicated() -> None:
    text = "\n".join(SGL_TB.format(rank=f"TP{r}") for r in (3, 0, 1))
    causes = extract_root_causes(_lines(text))
    assert len(causes) == 1
    assert causes[0].splitlines()[1] == "(raised on TP3, TP0, TP1)"


def test_other_ranks_and_tqdm_interleave_inside_a_traceback() -> None:
    text = """\
[2026-01-25 01:19:07 TP0] Load weight begin. avail mem=78.77 GB
[2026-01-25 01:19:08 TP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/py/scheduler.py", line 10, in run
    scheduler = Scheduler(
[2026-01-25 01:19:08 TP0] Using CompressedTensorsWNA16MarlinMoEMethod
Loading safetensors checkpoint shards:   0% Completed | 0/12 [00:00<?, ?it/s]
  File "/py/layer.py", line 501, in _load_w2
    loaded_weight = loaded_weight.narrow(
RuntimeError: start (8) + length (8) exceeds dimension size (8).

[2026-01-25 01:19:08] Received sigquit from a child process. It usually means the child failed.
./run.sh: line 7: 2502678 Killed                  python3 -m sglang.launch_server --tp-size 2
"""
    causes = extract_root_causes(_lines(text), kind=SGLANG)
    assert len(causes) == 1
    block = causes[0].splitlines()
    assert block[0] == "RuntimeError: start (8) + length (8) exceeds dimension size (8)."
    assert block[1] == "(raised on TP1)"
    assert '  File "/py/layer.py", line 501, in _load_w2' in block
    assert not any("Loading safetensors" in line or "Using Compressed" in line for line in block)


def test_chained_during_handling() -> None:
    text = """\
[2025-10-16 09:06:10 TP2] Scheduler hit an exception: Traceback (most recent call last):
  File "/py/loader.py", line 5, in load
    param = params_dict[name]
            ~~~~~~~~~~~^^^^^^
KeyError: 'model.layers.0.mlp.experts.w2_weight'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/py/scheduler.py", line 9, in run
    raise ValueError(f"cannot load {name}: {e}")
ValueError: cannot load model.layers.0.mlp.experts.w2_weight: 'model.layers.0.mlp.experts.w2_weight'
[2025-10-16 09:06:10] Received sigquit from a child process. It usually means the child failed.
"""
    causes = extract_root_causes(_lines(text))
    assert len(causes) == 1, causes
    block = causes[0].splitlines()
    assert block[0].startswith("ValueError: cannot load model.layers.0")
    assert "caused by: KeyError: 'model.layers.0.mlp.experts.w2_weight'" in block
    assert '  File "/py/scheduler.py", line 9, in run' in block


def test_chained_direct_cause_with_colons_in_message() -> None:
    text = """\
Traceback (most recent call last):
  File "/py/a.py", line 1, in f
    g()
OSError: [Errno 2] No such file or directory: '/models/x/config.json'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/py/b.py", line 2, in h
    raise RuntimeError("Failed to load: config") from e
RuntimeError: Failed to load: config: see http://example.com/a:b
"""
    causes = extract_root_causes(_lines(text))
    assert _headlines(causes) == ["RuntimeError: Failed to load: config: see http://example.com/a:b"]
    assert "caused by: OSError: [Errno 2] No such file or directory: '/models/x/config.json'" in causes[0]


VLLM_OOM = """\
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] Exception in worker \
VllmWorkerProcess while processing method load_model.
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] Traceback (most recent call last):
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] File "/vllm/executor/\
multiproc_worker_utils.py", line 236, in _run_worker_process
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] output = run_method(worker, \
method, args, kwargs)
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] File "/vllm/model.py", \
line 99, in load_model
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] return torch.empty(shape)
(VllmWorkerProcess pid={pid}) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] torch.OutOfMemoryError: CUDA \
out of memory. Tried to allocate 20.00 MiB. GPU {gpu} has a total capacity of 14.62 GiB
"""


def test_vllm_prefixed_every_line_multi_pid_interleaved_dedup() -> None:
    a = _lines(VLLM_OOM.format(pid=101, gpu=1))
    b = _lines(VLLM_OOM.format(pid=102, gpu=2))
    interleaved = [line for pair in zip(a, b, strict=True) for line in pair]  # two workers writing at once
    causes = extract_root_causes(interleaved, kind=VLLM)
    assert len(causes) == 1, causes
    block = causes[0].splitlines()
    assert block[0] == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total " \
        "capacity of 14.62 GiB"
    assert block[1] == "(raised on VllmWorkerProcess pid=101, VllmWorkerProcess pid=102)"
    assert '  File "/vllm/model.py", line 99, in load_model' in block
    assert "    return torch.empty(shape)" in block


def test_vllm_v1_engine_core_then_api_server_consequence() -> None:
    text = """\
(EngineCore_DP0 pid=77) ERROR 11-30 22:19:53 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=77) ERROR 11-30 22:19:53 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=77) ERROR 11-30 22:19:53 [core.py:700]   File "/vllm/v1/engine/core.py", line 691, in run
(EngineCore_DP0 pid=77) ERROR 11-30 22:19:53 [core.py:700]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=77) ERROR 11-30 22:19:53 [core.py:700] ValueError: To serve at least one request with \
max seq len (32768), 4.0 GiB KV cache is needed, which is larger than the available KV cache memory (1.2 GiB).
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/vllm/entrypoints/openai/api_server.py", line 1900, in <module>
(APIServer pid=1)     uvloop.run(run_server(args))
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
    causes = extract_root_causes(_lines(text), kind=VLLM)
    heads = _headlines(causes)
    assert heads[0].startswith("ValueError: To serve at least one request with max seq len (32768)")
    assert heads[1].startswith("RuntimeError: Engine core initialization failed.")
    assert causes[0].splitlines()[1] == "(raised on EngineCore_DP0 pid=77)"


def test_reversed_export_without_header() -> None:
    forward = """\
Traceback (most recent call last):
File "/sgl/model_runner.py", line 10, in load_model
self.model = get_model(
File "/sgl/loader.py", line 370, in load_model
model.load_weights(weights)
File "/sgl/models/llama.py", line 508, in load_weights
param = params_dict[name]
safetensors._safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge
"""
    lines = [f"ERROR 2025-04-07T19:13:52.{i:09d}Z {line}" for i, line in enumerate(_lines(forward))]
    lines.insert(0, "ERROR 2025-04-07T19:13:53.000000000Z ./entrypoint.sh: line 48: 27 Killed python3 -m x")
    lines.insert(1, "ERROR 2025-04-07T19:13:53.000000000Z [2025-04-07 19:13:52] Received sigquit from a child "
                    "process. It usually means the child failed.")
    rev = lines[:2] + list(reversed(lines[2:]))[:-1]  # newest first, and the header line lost
    causes = extract_root_causes(rev, kind=SGLANG)
    block = causes[0].splitlines()
    assert block[0] == "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"
    frames = [line.strip() for line in block if line.strip().startswith("File ")]
    assert frames == [  # put back in call order, innermost last
        'File "/sgl/model_runner.py", line 10, in load_model',
        'File "/sgl/loader.py", line 370, in load_model',
        'File "/sgl/models/llama.py", line 508, in load_weights',
    ]
    assert block[-1] == "    param = params_dict[name]"
    assert len(causes) == 1


def test_traceback_cut_at_the_start_and_lost_indentation() -> None:
    text = """\
self.model = get_model(
File "/sgl/loader.py", line 370, in load_model
model.load_weights(weights)
KeyError: 'layers.0.self_attn.qkv_proj.weight'
"""
    causes = extract_root_causes(_lines(text))
    assert _headlines(causes) == ["KeyError: 'layers.0.self_attn.qkv_proj.weight'"]
    assert "    model.load_weights(weights)" in causes[0].splitlines()


def test_error_line_is_not_the_last_line() -> None:
    text = """\
[2024-12-13 01:47:34] Initialization failed. warmup error: Traceback (most recent call last):
  File "/sglang/srt/server.py", line 621, in _wait_and_warmup
    assert res.status_code == 200, f"{res=}, {res.text=}"
AssertionError: res=<Response [502]>, res.text=''

[2024-12-13 01:47:34] Received sigquit from a child process. It usually means the child failed.
Killed
"""
    assert _headlines(extract_root_causes(_lines(text))) == ["AssertionError: res=<Response [502]>, res.text=''"]


def test_bare_exception_name() -> None:
    text = """\
Traceback (most recent call last):
  File "/sglang/launch_server.py", line 14, in <module>
    launch_server(server_args)
KeyboardInterrupt
"""
    assert _headlines(extract_root_causes(_lines(text))) == ["KeyboardInterrupt"]


def test_argparse_error_without_usage_block() -> None:
    text = "\n launch -m sglang.launch_server --tp 8\n\nlaunch_server.py: error: unrecognized arguments: --tp_size 2"
    assert extract_root_causes(text.split("\n")) == ["launch_server.py: error: unrecognized arguments: --tp_size 2"]


def test_argparse_error_with_usage_block_and_new_prog() -> None:
    text = """\
[W219 10:00:00] Warning: PYTORCH_CUDA_ALLOC_CONF is deprecated
usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]
                    [--host HOST] [--port PORT]
sglang serve: error: argument --speculative-algorithm: invalid choice: 'EAGLE4' (choose from 'EAGLE', 'EAGLE3')
"""
    assert _headlines(extract_root_causes(_lines(text))) == [
        "sglang serve: error: argument --speculative-algorithm: invalid choice: 'EAGLE4' "
        "(choose from 'EAGLE', 'EAGLE3')"
    ]


def test_benign_error_words_are_never_root_causes() -> None:
    text = """\
[2026-01-25 01:19:07 TP0] Ignore import error when loading sglang.srt.models.glmasr: cannot import name 'GlmAsrConfig'
[2026-01-25 01:19:07 TP0] The following error message 'operation scheduled before its operands' can be ignored.
[2026-01-25 01:19:07] Metrics: error_count=0, errors=0
/opt/venv/lib/python3.11/site-packages/sglang/launch_server.py:71: UserWarning: 'python -m' is still supported.
  Example: sglang serve --model-path <model> [options]
  warnings.warn(
[2026-01-25 01:19:07] Error: none
"""
    assert extract_root_causes(_lines(text), kind=SGLANG) == []


def test_fatal_markers_when_no_traceback() -> None:
    text = """\
[2026-03-13 14:24:20 TP0] Load weight begin. avail mem=78.77 GB
[2026-03-13 14:24:23] Rank 0 scheduler is dead. Please check if there are relevant logs.
[2026-03-13 14:24:23] Received sigquit from a child process. It usually means the child failed.
[2026-03-13 14:24:23] Received sigquit from a child process. It usually means the child failed.
Killed
"""
    assert extract_root_causes(_lines(text), kind=SGLANG) == [
        "Rank 0 scheduler is dead. Please check if there are relevant logs.",
        "Received sigquit from a child process. It usually means the child failed.",
    ]


def test_markers_give_way_to_a_traceback() -> None:
    text = "[2026-03-13 14:24:23] Received sigquit from a child process.\n" + SGL_TB.format(rank="TP0")
    heads = _headlines(extract_root_causes(_lines(text), kind=SGLANG))
    assert heads == [
        "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'set_eagle3_layers_to_capture'"
    ]


def test_consequence_errors_come_after_the_real_one() -> None:
    text = """\
[2025-01-01 00:00:00] Traceback (most recent call last):
  File "/sglang/engine.py", line 850, in _launch_subprocesses
    data = scheduler_pipe_readers[i].recv()
RuntimeError: Initialization failed. Please see the error messages above.
[2025-01-01 00:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/scheduler.py", line 1, in run
    x()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
"""
    assert _headlines(extract_root_causes(_lines(text))) == [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "RuntimeError: Initialization failed. Please see the error messages above.",
    ]


def test_unprefixed_traceback_is_not_blamed_on_the_last_rank() -> None:
    text = """\
[2025-01-01 00:00:00 TP3] Load weight begin. avail mem=10 GB
Traceback (most recent call last):
  File "/usr/lib/python3.12/runpy.py", line 198, in _run_module_as_main
    return _run_code(code, main_globals, None,
ModuleNotFoundError: No module named 'sgl_kernel'
"""
    block = extract_root_causes(_lines(text))[0].splitlines()
    assert block[0] == "ModuleNotFoundError: No module named 'sgl_kernel'"
    assert not any("raised on" in line for line in block)


def test_info_level_and_ignored_exceptions_rank_last() -> None:
    text = """\
Exception ignored in: <function Pool.__del__ at 0x7f>
Traceback (most recent call last):
  File "/usr/lib/python3.12/multiprocessing/pool.py", line 268, in __del__
    self._change_notifier.put(None)
ValueError: Queue is closed
Traceback (most recent call last):
  File "/sglang/x.py", line 3, in main
    run()
SystemExit: 1
"""
    assert _headlines(extract_root_causes(_lines(text))) == ["SystemExit: 1", "ValueError: Queue is closed"]


def test_exception_group() -> None:
    text = """\
  + Exception Group Traceback (most recent call last):
  |   File "/app/main.py", line 5, in main
  |     async with asyncio.TaskGroup() as tg:
  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "/app/main.py", line 9, in worker
    |     raise ConnectionError("peer closed")
    | ConnectionError: peer closed
    +------------------------------------
"""
    heads = _headlines(extract_root_causes(_lines(text)))
    assert "ConnectionError: peer closed" in heads
    assert heads[0] == "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)"


def test_bounded_causes_and_frames() -> None:
    lines: list[str] = []
    for i in range(40):
        lines.append("Traceback (most recent call last):")
        for j in range(100):
            lines.append(f'  File "/deep/mod{j}.py", line {j}, in f{j}')
            lines.append(f"    f{j + 1}()")
        lines.append(f"ValueError{chr(65 + i % 26)}{i}: bad thing")
    causes = extract_root_causes(lines)
    assert len(causes) == 8
    block = causes[0].splitlines()
    assert block[0] == "ValueErrorA0: bad thing"
    assert sum(1 for line in block if line.strip().startswith("File ")) == 12
    assert '  File "/deep/mod99.py", line 99, in f99' in block  # the innermost frames are the ones kept
    assert "88 earlier frame(s) not shown" in causes[0]


def test_multiline_text_input() -> None:
    text = SGL_TB.format(rank="TP0")
    assert extract_root_causes([text]) == extract_root_causes(_lines(text))


def test_strip_prefixes() -> None:
    assert strip_prefixes("[2025-10-16 09:06:10 TP5] Load weight begin.") == ("TP5", None, "Load weight begin.")
    assert strip_prefixes("[2026-02-20 11:13:52.123 DP0 TP1 EP1] x") == ("DP0 TP1 EP1", None, "x")
    assert strip_prefixes("[2025-03-08 12:29:04] server_args=") == ("main", None, "server_args=")
    assert strip_prefixes("(EngineCore_DP0 pid=123) ERROR 11-30 22:19:53 [core.py:700]   File \"x\"") == (
        "EngineCore_DP0 pid=123", "ERROR", '  File "x"'
    )
    assert strip_prefixes("INFO 03-07 12:29:02 __init__.py:190] Automatically detected") == (
        None, "INFO", "Automatically detected"
    )
    assert strip_prefixes("ERROR 2025-04-07T19:13:52.541718006Z [2025-04-07 19:13:52] Received sigquit") == (
        "main", "ERROR", "Received sigquit"
    )
    bar = "  0%|          | 0/13 [00:00<?, ?it/s]"
    assert strip_prefixes(bar) == (None, None, bar)


def test_ansi_colours_in_lines_given_directly() -> None:
    lines = [
        "\x1b[31mTraceback (most recent call last):\x1b[0m",
        '  File \x1b[35m"/a.py"\x1b[0m, line \x1b[35m1\x1b[0m, in \x1b[35mf\x1b[0m',
        "    x = d[k]",
        "\x1b[1;35mKeyError\x1b[0m: \x1b[35m'k'\x1b[0m",
    ]
    assert extract_root_causes(lines)[0].splitlines() == [
        "KeyError: 'k'",
        '  File "/a.py", line 1, in f',
        "    x = d[k]",
    ]


def test_click_usage_error_is_the_root_cause() -> None:
    # transformers serve (typer/click) on the H200, launched with a flag it does not know: exit 2, no traceback.
    log = [
        "Usage: python -m transformers.cli.transformers serve [OPTIONS] [FORCE_MODEL]",
        "Try 'python -m transformers.cli.transformers serve --help' for help.",
        "",
        "Error: No such option '--tp'.",
        "",
        "Available options for 'python -m transformers.cli.transformers serve':",
        "  --port INTEGER  Port to bind the server to.  [default: 8000]",
    ]
    assert extract_root_causes(log) == ["Error: No such option '--tp'."]
    assert extract_root_causes(["Error: something benign happened"]) == []


def test_slurmstepd_cancel_notice_is_never_a_root_cause() -> None:
    """slurmstepd writes its notice into the task's own output once scancel or srun's --kill-on-bad-exit ended
    the step: a consequence of another node's failure, though shaped like a usage error. A time limit says why."""
    cancelled = """\
[2026-12-02 15:27:20 TP0] Init torch distributed begin.
slurmstepd-node1: error: *** STEP 2.0 ON node1 CANCELLED AT 2026-12-02T15:27:20 ***
slurmstepd: error: *** JOB 7 ON node1 CANCELLED AT 2026-12-02T15:27:21 ***
"""
    assert extract_root_causes(_lines(cancelled)) == []
    assert extract_root_causes(_lines(cancelled + SGL_TB.format(rank="TP0")))[0].startswith("AttributeError: ")
    limit = "slurmstepd: error: *** JOB 7 ON node1 CANCELLED AT 2026-12-02T15:27:21 DUE TO TIME LIMIT ***"
    assert _headlines(extract_root_causes([limit])) == [limit]
