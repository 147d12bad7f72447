"""Command line (SGLang's flags) and knobs (the PYTEST_SGLANG_SIM environment variable) of the simulator."""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

KNOB_ENV = "PYTEST_SGLANG_SIM"
# A fleet member's name ("router", "worker0", "prefill0", "decode1", ...), set by the plugin on each member's
# environment: the fault knobs apply to the member the `fault_member` knob names.
MEMBER_ENV = "PYTEST_SGLANG_SIM_MEMBER"
DISAGGREGATION_MODES = ("null", "prefill", "decode")
DEFAULT_BOOTSTRAP_PORT = 8998
FAULTS = ("traceback", "exit", "hang", "bad-flag")
METRICS_FORMATS = ("sglang", "vllm")
DEFAULT_MODEL = "sglang-sim/tiny-llama"


@dataclass
class Knobs:
    startup_seconds: float = 2.0  # launch to "fired up", spread over the phases
    decode_tok_s: float = 50.0  # each request's own token pace after its first token
    ttft_ms: float = 20.0  # the first token leaves this long after the request got a batch slot
    max_batch: int = 64  # more concurrent requests wait in a queue
    fault: str | None = None  # "traceback", "exit", "hang", "bad-flag"
    fault_after: float | None = None  # seconds into startup; default 60% of startup_seconds
    fault_node: int | None = None  # the node rank (--node-rank) the fault happens on; None: node 0
    crash_after_requests: int | None = None  # scheduler crash (traceback, sigquit, SIGKILL) after N requests
    fault_member: str | None = None  # the fleet member (its PYTEST_SGLANG_SIM_MEMBER) the fault knobs apply to
    ignore_sigterm: bool = False  # children setsid() and ignore SIGTERM: they escape on purpose
    accept_length: float = 3.2  # tokens per verify step, only under speculative decoding
    spec_speedup: float = 1.0  # per-request pace multiplier under speculative decoding
    jitter: float = 0.0  # fraction: each benchmark round's pace (decode and TTFT) varies at random by up to this
    session_drift: float = 0.0  # CV of one lognormal speed factor per pytest run, shared by its servers (drift.py)
    instance_drift: float = 0.0  # CV of one lognormal speed factor per server instance (drift.py)
    wander: float = 0.0  # per minute: the speed's slow random walk within a run, sd of log speed after 1 min
    output_variant: int = 0  # not 0: every output token from the 5th on differs from variant 0's (engine.py)
    output_margin: float = 4.0  # nats each output token leads its runner-up by (the other variant's token)
    vocab_size: int = 32000  # token ids at or above it are answered 400 "out of vocabulary"; /tokenize keeps below
    metrics_format: str = "sglang"  # /metrics in SGLang's names (with --enable-metrics) or "vllm" (always)
    metrics_skew: int = 0  # /metrics counts this many generation tokens too many per request (a miscounting server)
    reuse_port: bool = False  # SO_REUSEPORT: simulators started on one port share its load (a faster "server")
    request_trace: str | None = None  # a file: one JSON line per streamed request, the sim's own times (trace.py)

    @property
    def fault_at(self) -> float:
        return self.fault_after if self.fault_after is not None else 0.6 * self.startup_seconds

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class KnobError(ValueError):
    pass


def load_knobs(raw: str | None = None) -> Knobs:
    """Parse the knobs from JSON (default: the PYTEST_SGLANG_SIM variable); absent means all defaults."""
    if raw is None:
        raw = os.environ.get(KNOB_ENV)
    if raw is None or not raw.strip():
        return Knobs()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise KnobError(f"{KNOB_ENV} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise KnobError(f"{KNOB_ENV} must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in fields(Knobs)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise KnobError(
            f"{KNOB_ENV}: unknown knob(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    knobs = Knobs(**data)
    _validate(knobs)
    return knobs


def _validate(k: Knobs) -> None:
    def num(name: str, positive: bool) -> None:
        value = getattr(k, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KnobError(f"{KNOB_ENV}: {name} must be a number, got {value!r}")
        if value < 0 or (positive and value == 0):
            raise KnobError(f"{KNOB_ENV}: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}")

    num("startup_seconds", False)
    num("decode_tok_s", True)
    num("ttft_ms", False)
    num("accept_length", True)
    num("spec_speedup", True)
    num("jitter", False)
    num("output_margin", False)
    for name in ("session_drift", "instance_drift", "wander"):
        num(name, False)
        if not math.isfinite(getattr(k, name)):
            raise KnobError(f"{KNOB_ENV}: {name} must be a finite number (0.15: about 15 %), got {getattr(k, name)!r}")
    if k.jitter >= 1:
        raise KnobError(f"{KNOB_ENV}: jitter must be a fraction below 1 (0.05: up to 5 %), got {k.jitter!r}")
    for name, least in (("output_variant", None), ("vocab_size", 256), ("metrics_skew", 0)):
        value = getattr(k, name)
        if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
            raise KnobError(f"{KNOB_ENV}: {name} must be an integer{f' >= {least}' if least is not None else ''}, "
                            f"got {value!r}")
    if k.metrics_format not in METRICS_FORMATS:
        raise KnobError(f"{KNOB_ENV}: metrics_format must be one of {', '.join(METRICS_FORMATS)}, "
                        f"got {k.metrics_format!r}")
    if isinstance(k.max_batch, bool) or not isinstance(k.max_batch, int) or k.max_batch < 1:
        raise KnobError(f"{KNOB_ENV}: max_batch must be an integer >= 1, got {k.max_batch!r}")
    if k.fault is not None and k.fault not in FAULTS:
        raise KnobError(f"{KNOB_ENV}: fault must be one of {', '.join(FAULTS)} or null, got {k.fault!r}")
    if k.fault_after is not None:
        num("fault_after", False)
    if k.fault_node is not None and (isinstance(k.fault_node, bool) or not isinstance(k.fault_node, int)
                                     or k.fault_node < 0):
        raise KnobError(f"{KNOB_ENV}: fault_node must be a node rank (an integer >= 0) or null, got {k.fault_node!r}")
    if k.crash_after_requests is not None and (
        isinstance(k.crash_after_requests, bool) or not isinstance(k.crash_after_requests, int)
        or k.crash_after_requests < 0
    ):
        raise KnobError(f"{KNOB_ENV}: crash_after_requests must be an integer >= 0 or null")
    if k.fault_member is not None and (not isinstance(k.fault_member, str) or not k.fault_member.strip()):
        raise KnobError(f"{KNOB_ENV}: fault_member must be a member name (router, worker0, prefill0, decode0, ...) "
                        f"or null, got {k.fault_member!r}")
    if k.request_trace is not None and (not isinstance(k.request_trace, str) or not k.request_trace):
        raise KnobError(f"{KNOB_ENV}: request_trace must be a file path (a non-empty string) or null, "
                        f"got {k.request_trace!r}")
    k.ignore_sigterm = bool(k.ignore_sigterm)
    k.reuse_port = bool(k.reuse_port)


def for_member(knobs: Knobs, member: str | None = None) -> Knobs:
    """The knobs as the process named ``member`` (default: its PYTEST_SGLANG_SIM_MEMBER) takes them: the fault
    knobs (fault, fault_after, crash_after_requests) only when fault_member is null or names this process; a
    process without a member name (a plain server) takes them only when fault_member is null."""
    if member is None:
        member = os.environ.get(MEMBER_ENV) or None
    if knobs.fault_member is None or knobs.fault_member == member:
        return knobs
    return replace(knobs, fault=None, fault_after=None, crash_after_requests=None)


def build_parser() -> argparse.ArgumentParser:
    """The subset of SGLang's flags the simulator uses; everything else is accepted and ignored."""
    p = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", default=DEFAULT_MODEL)
    p.add_argument("--tokenizer-path", dest="tokenizer_path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--speculative-algorithm", dest="speculative_algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", dest="speculative_draft_model_path", default=None)
    p.add_argument("--api-key", dest="api_key", default=None)
    p.add_argument("--stream-interval", dest="stream_interval", type=int, default=1)
    p.add_argument("--served-model-name", dest="served_model_name", default=None)
    p.add_argument("--context-length", dest="context_length", type=int, default=None)
    p.add_argument("--enable-metrics", dest="enable_metrics", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", dest="node_rank", type=int, default=0)
    p.add_argument("--dist-init-addr", dest="dist_init_addr", default=None)
    p.add_argument("--disaggregation-mode", dest="disaggregation_mode", choices=DISAGGREGATION_MODES, default="null")
    p.add_argument("--disaggregation-bootstrap-port", dest="disaggregation_bootstrap_port", type=int,
                   default=DEFAULT_BOOTSTRAP_PORT)
    p.add_argument("--disaggregation-transfer-backend", dest="disaggregation_transfer_backend", default="mooncake")
    p.add_argument("--disaggregation-decode-retraction-backup", dest="disaggregation_decode_retraction_backup",
                   default=None)
    return p


@dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: str
    host: str
    port: int
    tp_size: int
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    api_key: str | None
    served_model_name: str
    context_length: int
    ignored_args: list[str]
    enable_metrics: bool = False
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_decode_retraction_backup: str | None = None
    stream_interval: int = 1

    @property
    def disaggregated(self) -> bool:
        return self.disaggregation_mode != "null"

    @property
    def local_tp(self) -> int:
        """The TP ranks this node runs: --tp counts the GPUs of all nodes."""
        return max(1, self.tp_size // self.nnodes)

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ignored_args")
        return d

    def repr_line(self) -> str:
        """`ServerArgs(model_path='...', ...)`, the way SGLang's dataclass repr reads."""
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"ServerArgs({body})"


def parse_args(argv: list[str], knobs: Knobs) -> ServerArgs:
    """Parse like SGLang; under fault "bad-flag" unknown flags are fatal (usage + error on stderr, exit 2)."""
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    if knobs.fault == "bad-flag" and (knobs.fault_node or 0) == ns.node_rank:  # fault_node: that node's alone
        parser.error(f"unrecognized arguments: {' '.join(unknown) if unknown else '--bad-flag'}")
    if ns.tp_size < 1:
        parser.error(f"argument --tp-size/--tp: invalid value: {ns.tp_size}")
    if ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"--nnodes {ns.nnodes} --node-rank {ns.node_rank}: the node rank must be in 0..nnodes-1")
    if ns.nnodes > 1 and (not ns.dist_init_addr or ":" not in ns.dist_init_addr):
        parser.error("--nnodes > 1 needs --dist-init-addr HOST:PORT (the address rank 0 listens on)")
    return ServerArgs(
        model_path=ns.model_path,
        tokenizer_path=ns.tokenizer_path or ns.model_path,
        host=ns.host,
        port=ns.port,
        tp_size=ns.tp_size,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        api_key=ns.api_key,
        served_model_name=ns.served_model_name or ns.model_path,
        context_length=ns.context_length or 32768,
        ignored_args=list(unknown),
        enable_metrics=ns.enable_metrics,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        disaggregation_mode=ns.disaggregation_mode,
        disaggregation_bootstrap_port=ns.disaggregation_bootstrap_port,
        disaggregation_transfer_backend=ns.disaggregation_transfer_backend,
        stream_interval=max(1, ns.stream_interval),
        disaggregation_decode_retraction_backup=ns.disaggregation_decode_retraction_backup,
    )
