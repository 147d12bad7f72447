"""Per-server rules: how to launch each kind, how it says it is ready, how it says it is failing.

Everything that knows SGLang's or vLLM's wording lives in this file, so a new server version means editing
one table. The watcher (pytest_sglang.watch) applies these rules; it knows no server by name.

Every regex here declares, beside it, its *literals*: strings one of which every line it matches holds
(case-sensitive). The watcher skips a stretch of log that holds none of the literals of any rule still
pending without running a single regex on it, so a literal set that misses a line the regex matches would
hide that line: tests/watch/test_watch_literals.py checks every declaration against real logs. A rule with no
literals declared (a profile's own `ready_pattern`) is tested on every line instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseRule:
    """A log line that marks the start of a startup phase. The first match wins; later matches are ignored."""

    name: str  # key in sglang_server.phases
    label: str  # words for the live status line
    pattern: re.Pattern[str]
    literals: tuple[str, ...] = ()  # every line `pattern` matches holds one of these; (): none declared


@dataclass(frozen=True)
class LinePattern:
    """A regex searched in each log line, with the literals every line it matches holds."""

    pattern: re.Pattern[str]
    literals: tuple[str, ...] = ()


@dataclass(frozen=True)
class Kind:
    name: str
    command: tuple[str, ...]  # launch template; {python} {model} {host} {port} are substituted
    model_flag: str | None  # dropped from the command when the profile names no model
    ready_pattern: str | None  # regex; None: readiness is the health answer alone
    health_path: str | None  # None: readiness is the log line alone
    # Asked in turn once the ready line is seen, to confirm HTTP answers; a 404 or 401 moves on to the next,
    # the health path is the last resort. SGLang's /health waits a second or more per call (0.5.23
    # http_server.py:780), and its ready line follows a served warmup request; /ready (0.5.23, no key needed,
    # 200 once the server is Up) may be missing from older versions, /v1/models is in all of them.
    ready_probe_paths: tuple[str, ...] = ()
    # The flag that makes the ready line come without a served request: then only the health path will do.
    skip_warmup_flag: str | None = None
    phases: tuple[PhaseRule, ...] = ()
    # Lines that mean the server is failing even though its process is still alive. A traceback is always
    # one; these catch failures that print no traceback of their own (SGLang's parent after a child died).
    fatal_markers: tuple[LinePattern, ...] = ()
    # Shard progress from tqdm bars ("Loading safetensors checkpoint shards:  75% Completed | 48/64").
    progress_pattern: re.Pattern[str] | None = None
    progress_literals: tuple[str, ...] = ()
    ready_literals: tuple[str, ...] = ()  # those of ready_pattern


def _rule(name: str, label: str, pattern: str, *literals: str) -> PhaseRule:
    return PhaseRule(name, label, re.compile(pattern), literals)


def _marker(pattern: str, *literals: str) -> LinePattern:
    return LinePattern(re.compile(pattern), literals)


# "Loading safetensors checkpoint shards:  75% Completed | 48/64 [...]", "Loading pt checkpoint shards: ...",
# 0.5.23's "Multi-thread loading shards: 100% Completed | 1/1 [...]". The leading word is spelt in its three
# cases (not under (?i)) so that its literals below are really required.
_SHARD_PROGRESS = re.compile(
    r"\b(?:[Ll]oad(?:ing|ed)|LOAD(?:ING|ED))\b(?i:[^:|]*?(?:shards|weights|safetensors))[^:|]*:"
    r"\s*(\d+)%[^|]*\|[^|]*?\|?\s*(\d+)/(\d+)"
)
_SHARD_PROGRESS_LITERALS = ("oading", "oaded", "OADING", "OADED")

SGLANG = Kind(
    name="sglang",
    command=("{python}", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "{host}",
             "--port", "{port}"),
    model_flag="--model-path",
    ready_pattern=r"The server is fired up and ready to roll!",
    ready_literals=("The server is fired up and ready to roll!",),
    health_path="/health",
    ready_probe_paths=("/ready", "/v1/models"),
    skip_warmup_flag="--skip-server-warmup",
    phases=(
        _rule("init_distributed", "initialising torch distributed",
              r"Init torch distributed begin|Init parallel begin",
              "Init torch distributed begin", "Init parallel begin"),
        _rule("load_weights", "loading weights", r"Load weight begin", "Load weight begin"),
        _rule("kv_cache", "allocating KV cache", r"KV Cache is allocated", "KV Cache is allocated"),
        _rule("cuda_graph", "capturing CUDA graphs", r"Capture (?!draft)(?:\w+ )*?(?:cuda|CUDA) graph begin",
              " graph begin"),
        _rule("draft_cuda_graph", "capturing draft CUDA graphs", r"Capture draft (?:\w+ )*?(?:cuda|CUDA) graph begin",
              "Capture draft "),
        _rule("http_up", "HTTP server up", r"Uvicorn running on|Application startup complete",
              "Uvicorn running on", "Application startup complete"),
        _rule("warmup", "warming up", r'"(?:GET /get_model_info|GET /model_info|POST /generate) HTTP',
              '"GET /get_model_info HTTP', '"GET /model_info HTTP', '"POST /generate HTTP'),
    ),
    fatal_markers=(
        _marker(r"Received sigquit from a child proces", "Received sigquit from a child proces"),
        _marker(r"SIGQUIT received\.", "SIGQUIT received."),
        _marker(r"Initialization failed\.", "Initialization failed."),
        _marker(r"scheduler is dead|scheduler died during initialization",
                "scheduler is dead", "scheduler died during initialization"),
        _marker(r"[Ww]atchdog timeout", "atchdog timeout"),
    ),
    progress_pattern=_SHARD_PROGRESS,
    progress_literals=_SHARD_PROGRESS_LITERALS,
)

VLLM = Kind(
    name="vllm",
    command=("{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--host", "{host}",
             "--port", "{port}"),
    model_flag="--model",
    ready_pattern=r"Application startup complete\.",
    ready_literals=("Application startup complete.",),
    health_path="/health",
    phases=(
        _rule("init_engine", "initialising engine", r"Initializing an? (?:V\d+ )?(?:LLM )?engine", "Initializing a"),
        _rule("load_weights", "loading weights", r"Starting to load model|Loading weights|Loading safetensors",
              "Starting to load model", "Loading weights", "Loading safetensors"),
        _rule("compile", "compiling the model",
              r"Warming up model for the compilation|torch\.compile|Compiling a graph|Dynamo bytecode transform",
              "Warming up model for the compilation", "torch.compile", "Compiling a graph",
              "Dynamo bytecode transform"),
        _rule("kv_cache", "allocating KV cache", r"KV cache size|# (?:GPU|CPU) blocks|Maximum concurrency for",
              "KV cache size", "# GPU blocks", "# CPU blocks", "Maximum concurrency for"),
        _rule("cuda_graph", "capturing CUDA graphs", r"Capturing CUDA graph|Capturing cudagraph|Graph capturing",
              "Capturing CUDA graph", "Capturing cudagraph", "Graph capturing"),
        _rule("http_up", "HTTP server up", r"Starting vLLM (?:API )?server|Available routes are",
              "Starting vLLM ", "Available routes are"),
    ),
    fatal_markers=(
        _marker(r"EngineCore failed to start|Engine core initialization failed",
                "EngineCore failed to start", "Engine core initialization failed"),
        _marker(r"Worker failed with error|WorkerProc failed to start|WorkerProc hit an exception",
                "Worker failed with error", "WorkerProc failed to start", "WorkerProc hit an exception"),
        _marker(r"EngineCore encountered a fatal error|Exception in worker \S+ while processing method",
                "EngineCore encountered a fatal error", "Exception in worker "),
        _marker(r"EngineDeadError|AsyncLLM output_handler failed", "EngineDeadError", "AsyncLLM output_handler failed"),
    ),
    progress_pattern=_SHARD_PROGRESS,
    progress_literals=_SHARD_PROGRESS_LITERALS,
)

GENERIC = Kind(
    name="generic",
    command=(),
    model_flag=None,
    ready_pattern=None,
    health_path="/health",
    phases=(_rule("http_up", "HTTP server up", r"Uvicorn running on|Application startup complete|Listening on",
                  "Uvicorn running on", "Application startup complete", "Listening on"),),
)

KINDS: dict[str, Kind] = {k.name: k for k in (SGLANG, VLLM, GENERIC)}

# A fleet's router (sglang-router, smg): not a profile kind, the member in front of a fleet's servers. Its
# "Router ready" line comes before any worker joined, so it is no readiness signal: the fleet waits on its
# /readiness instead (server/fleet.py). It is written in Rust: a fatal error is a panic.
ROUTER = Kind(
    name="router",
    command=("{python}", "-m", "sglang_router.launch_router"),
    model_flag=None,
    ready_pattern=None,
    health_path="/health",
    phases=(_rule("http_up", "router up", r"Router ready|Starting server on|Listening on",
                  "Router ready", "Starting server on", "Listening on"),),
    fatal_markers=(_marker(r"panicked at", "panicked at"),),
)
