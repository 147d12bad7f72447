"""A stand-in for an SGLang server, stdlib only: same flags, same log lines, same endpoints, same crashes.

`python -m pytest_sglang.sim --model-path M --port P [--tp N] [--speculative-algorithm EAGLE3]
[--stream-interval N] ...` starts a
process tree like SGLang's (an HTTP main process, one scheduler child per TP rank, a detokenizer child) that
logs SGLang's startup lines at a configurable pace and then serves /health, /generate and the OpenAI
endpoints with paced, deterministic tokens. Knobs come as a JSON object in the PYTEST_SGLANG_SIM
environment variable (see config.Knobs); faults ("traceback", "exit", "hang", "bad-flag") and mid-session
crashes reproduce SGLang's real failure modes. `python -m pytest_sglang.sim.replay LOGFILE` replays a real
server log through a real process instead. `python -m pytest_sglang.sim.router <launch_router flags>` plays
sglang-router in front of simulators (data-parallel workers, or prefill/decode members started with
--disaggregation-mode); the knob `fault_member` with PYTEST_SGLANG_SIM_MEMBER picks the fleet member that faults.

Modules: config (flags and knobs), logfmt (SGLang's line format), engine (tokens and their schedule), drift
(the host's speed: a factor per pytest run, one per server instance, a wander within the run), server (main
process; nodes: its links to other nodes and the prefill's KV bootstrap), handler (the endpoints; http_base: the
wire and one generation's run, openai_api: the OpenAI endpoints), worker (scheduler and detokenizer children),
replay (log replayer), router (the router: router_cli its flags, log lines and panics, router_http its endpoints
and forwarding).
"""

from __future__ import annotations

from pytest_sglang.sim.config import DEFAULT_MODEL, FAULTS, KNOB_ENV, MEMBER_ENV, Knobs, for_member, load_knobs

__all__ = ["DEFAULT_MODEL", "FAULTS", "KNOB_ENV", "MEMBER_ENV", "Knobs", "for_member", "load_knobs"]
