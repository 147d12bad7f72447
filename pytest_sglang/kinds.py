"""Per-server rules: how to launch each kind, how it says it is ready, how it says it is failing.

Everything that knows SGLang's or vLLM's wording lives in this file, so a new server version means editing
one table. The watcher (watch.py) applies these rules; it knows no server by name.
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


@dataclass(frozen=True)
class Kind:
    name: str
    command: tuple[str, ...]  # launch template; {python} {model} {host} {port} are substituted
    model_flag: str | None  # dropped from the command when the profile names no model
    ready_pattern: str | None  # regex; None: readiness is the health answer alone
    health_path: str | None  # None: readiness is the log line alone
    phases: tuple[PhaseRule, ...] = ()
    # Lines that mean the server is failing even though its process is still alive. A traceback is always
    # one; these catch failures that print no traceback of their own (SGLang's parent after a child died).
    fatal_markers: tuple[re.Pattern[str], ...] = ()
    # Shard progress from tqdm bars ("Loading safetensors checkpoint shards:  75% Completed | 48/64").
    progress_pattern: re.Pattern[str] | None = None


def _rule(name: str, label: str, pattern: str) -> PhaseRule:
    return PhaseRule(name, label, re.compile(pattern))


# "Loading safetensors checkpoint shards:  75% Completed | 48/64 [...]", "Loading pt checkpoint shards: ...",
# 0.5.23's "Multi-thread loading shards: 100% Completed | 1/1 [...]".
_SHARD_PROGRESS = re.compile(
    r"(?i)\b(?:loading|loaded)\b[^:|]*?(?:shards|weights|safetensors)[^:|]*:"
    r"\s*(\d+)%[^|]*\|[^|]*?\|?\s*(\d+)/(\d+)"
)

SGLANG = Kind(
    name="sglang",
    command=("{python}", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "{host}",
             "--port", "{port}"),
    model_flag="--model-path",
    ready_pattern=r"The server is fired up and ready to roll!",
    health_path="/health",
    phases=(
        _rule("init_distributed", "initialising torch distributed",
              r"Init torch distributed begin|Init parallel begin"),
        _rule("load_weights", "loading weights", r"Load weight begin"),
        _rule("kv_cache", "allocating KV cache", r"KV Cache is allocated"),
        _rule("cuda_graph", "capturing CUDA graphs", r"Capture (?!draft)(?:\w+ )*?(?:cuda|CUDA) graph begin"),
        _rule("draft_cuda_graph", "capturing draft CUDA graphs", r"Capture draft (?:\w+ )*?(?:cuda|CUDA) graph begin"),
        _rule("http_up", "HTTP server up", r"Uvicorn running on|Application startup complete"),
        _rule("warmup", "warming up", r'"(?:GET /get_model_info|GET /model_info|POST /generate) HTTP'),
    ),
    fatal_markers=(
        re.compile(r"Received sigquit from a child proces"),
        re.compile(r"SIGQUIT received\."),
        re.compile(r"Initialization failed\."),
        re.compile(r"scheduler is dead|scheduler died during initialization"),
        re.compile(r"[Ww]atchdog timeout"),
    ),
    progress_pattern=_SHARD_PROGRESS,
)

VLLM = Kind(
    name="vllm",
    command=("{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--host", "{host}",
             "--port", "{port}"),
    model_flag="--model",
    ready_pattern=r"Application startup complete\.",
    health_path="/health",
    phases=(
        _rule("init_engine", "initialising engine", r"Initializing an? (?:V\d+ )?(?:LLM )?engine"),
        _rule("load_weights", "loading weights", r"Starting to load model|Loading weights|Loading safetensors"),
        _rule("compile", "compiling the model",
              r"Warming up model for the compilation|torch\.compile|Compiling a graph|Dynamo bytecode transform"),
        _rule("kv_cache", "allocating KV cache", r"KV cache size|# (?:GPU|CPU) blocks|Maximum concurrency for"),
        _rule("cuda_graph", "capturing CUDA graphs", r"Capturing CUDA graph|Capturing cudagraph|Graph capturing"),
        _rule("http_up", "HTTP server up", r"Starting vLLM (?:API )?server|Available routes are"),
    ),
    fatal_markers=(
        re.compile(r"EngineCore failed to start|Engine core initialization failed"),
        re.compile(r"Worker failed with error|WorkerProc failed to start|WorkerProc hit an exception"),
        re.compile(r"EngineCore encountered a fatal error|Exception in worker \S+ while processing method"),
        re.compile(r"EngineDeadError|AsyncLLM output_handler failed"),
    ),
    progress_pattern=_SHARD_PROGRESS,
)

GENERIC = Kind(
    name="generic",
    command=(),
    model_flag=None,
    ready_pattern=None,
    health_path="/health",
    phases=(_rule("http_up", "HTTP server up", r"Uvicorn running on|Application startup complete|Listening on"),),
)

KINDS: dict[str, Kind] = {k.name: k for k in (SGLANG, VLLM, GENERIC)}
