"""The profile schema: every key a profile takes, written once, in KEYS.

Read from it: the keys the loader accepts and the errors of a wrong TOML value, how `extends` merges each key,
each merged value's check and the Profile field it becomes (config/profiles.py; tests/config holds the
Profile's fields to this table), the rows --sglang-show prints of a profile's keys, and the README's key table
(tests/config regenerates it; print it with ``python -m pytest_sglang.config.schema --markdown``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_sglang.config import rules
from pytest_sglang.config.kinds import KINDS
from pytest_sglang.errors import SECRET_NAME

MergeRule = Literal["replace", "append", "update"]


def _same(value: Any, at: rules.At) -> Any:
    return value


def _strings(value: Any, at: rules.At) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class Shown:
    """A key's row in --sglang-show: its label, and its text from the value and whether --sglang-sim is on
    (None: no row)."""

    label: str
    text: Callable[[Any, bool], str | None]
    fleet: bool = False  # shown for a fleet too, whose members' own rows say the rest


@dataclass(frozen=True)
class Key:
    """One profile key. ``types`` and ``desc``: the TOML value it takes and how an error describes it;
    ``default``: the Profile field's value when no profile in the chain sets the key; ``merge``: how a profile
    that `extends` another merges it (a list appended, a table updated, the rest replaced); ``check``: what
    else the TOML value must be; ``parse``: its merged value as the Profile field (None: the fleet rule sets
    it); ``help``: its README row, "" to join the row of the key above."""

    name: str
    types: tuple[type, ...]
    desc: str
    default: Any = None
    merge: MergeRule = "replace"
    check: Callable[[Any, str], str | None] | None = None
    parse: Callable[[Any, rules.At], Any] | None = _same
    help: str = ""
    show: Shown | None = None
    field: bool = True  # a Profile field; `extends` is read by the loader alone

    def problem(self, value: Any) -> str | None:
        """What is wrong with a TOML value of this key, before any merge, or None."""
        if not isinstance(value, self.types) or isinstance(value, bool):
            return f"must be {self.desc}, got {value!r}."
        return self.check(value, self.desc) if self.check else None


def _shown_env(env: Mapping[str, str], sim: bool) -> str:
    return " ".join(f"{name}={'***' if SECRET_NAME.search(name) else shlex.quote(value)}"
                    for name, value in env.items()) or "(none beyond pytest's own environment)"


def _shown_sim(knobs: Mapping[str, Any], sim: bool) -> str:
    text = " ".join(f"{k}={v!r}" for k, v in knobs.items()) or "(defaults)"
    return text + ("" if sim else " (used only with --sglang-sim)")


def _shown_gpus(gpus: tuple[int, ...] | None, sim: bool) -> str | None:
    if gpus is None:
        return None
    return f"{', '.join(map(str, gpus))} (CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))})"


def _shown_cpus(cpus: tuple[int, ...] | None, sim: bool) -> str | None:
    return None if cpus is None else f"{', '.join(map(str, cpus))} (the launched tree's CPU affinity)"


# The order is the one merged values are checked in, so which of two mistakes a profile is told first stays
# as it was; "Known keys", the README's rows and --sglang-show's key rows follow it.
_ROLE = "a table such as { replicas = 1, args = [...], env = {...} }"
_SECONDS = "a number of seconds"
KEYS: tuple[Key, ...] = (
    Key("kind", (str,), "a string: " + ", ".join(repr(k) for k in KINDS), "sglang", parse=rules.kind,
        help='`"{default}"` (default), `"vllm"`, or `"generic"`: launch command, ready line, health path, crash '
             'signatures'),
    Key("model", (str,), "a string (model path or name)",
        help="model path or hub name (a local path that does not exist is an error before launch)"),
    Key("args", (list,), "a list of strings", (), "append", rules.scalar_items, _strings, "extra server flags"),
    Key("env", (dict,), "a table of strings", {}, "update", rules.string_values, lambda v, at: dict(v),
        "environment for the server; `${VAR}` and `${VAR:-default}` expand in every string value",
        Shown("env", _shown_env, fleet=True)),
    Key("extends", (str,), "the name of another profile", field=False,
        help="inherit another profile ({merges}, the rest overridden)"),
    Key("python", (str,), "a path to a Python interpreter",
        help="interpreter that runs the server (default: the one running pytest)"),
    Key("command", (list,), "a list of strings", check=rules.scalar_items, parse=lambda v, at: tuple(v) or None,
        help="the whole launch command; `{python}`, `{model}`, `{host}`, `{port}` are substituted"),
    Key("startup_timeout", (int, float), _SECONDS, 1800.0, parse=rules.seconds("startup_timeout"),
        help="seconds to wait for readiness (default {default})"),
    Key("stall_timeout", (int, float), _SECONDS, 300.0, parse=rules.seconds("stall_timeout"),
        help="seconds without new log output (line, phase, progress) before a startup fails (default {default}; "
             "`startup_timeout` stays the hard cap)"),
    Key("shutdown_grace", (int, float), _SECONDS, 30.0, parse=rules.seconds("shutdown_grace"),
        help="seconds between SIGTERM and SIGKILL at teardown (default {default})"),
    Key("host", (str,), "a host name or address", "127.0.0.1", help="default `{default}` and a free port"),
    Key("port", (int,), "a port number", parse=rules.port),
    Key("ready_pattern", (str,), "a regular expression", parse=rules.regex, help="override the kind's readiness rules"),
    Key("health_path", (str,), "an HTTP path such as '/health'"),
    Key("ssh", (str,), "an ssh destination such as 'user@host' or a Host alias of ~/.ssh/config",
        parse=rules.ssh_destination, help="launch on another host over OpenSSH, with extra ssh client arguments "
                                          "and the host's log folder ([docs/ssh.md](docs/ssh.md))"),
    Key("ssh_options", (list,), "a list of extra ssh client arguments, e.g. ['-p', '2222']", (),
        check=rules.scalar_items, parse=_strings),
    Key("remote_log_dir", (str,), "a folder on the ssh host for the server's log"),
    Key("slurm", (dict,), "a table such as { nodes = 2, gpus_per_node = 8, partition = 'gpu', time = '02:00:00' }",
        merge="update", parse=rules.slurm,
        help="`{ nodes, gpus_per_node, partition, time, args, queue_timeout }`: run over that many SLURM nodes "
             "([docs/multinode.md](docs/multinode.md))"),
    Key("cpus", (list, str), "CPU indices such as [0, 1, 2, 3] or a string such as '0-6' or '0-3,8'",
        parse=rules.cpus, show=Shown("cpus", _shown_cpus), help=(
            "CPU indices for the launched server's whole process tree, e.g. `[0, 1, 2, 3]` or `\"0-6\"` / "
            "`\"0-3,8\"` (taskset's list form; `${VAR}` works in the string): its affinity is set before it "
            "starts, so every worker it forks inherits it (two A/B servers and the load generator off each other's "
            "cores: the scheduler is a CPU-bound Python process); local launches only (an error on `ssh`/`slurm` "
            "profiles); shown by `--sglang-show`")),
    Key("gpus", (list,), "a list of GPU indices such as [0] or [0, 1], exported as CUDA_VISIBLE_DEVICES",
        check=rules.gpu_list, parse=rules.gpus, show=Shown("gpus", _shown_gpus),
        help="GPU indices for the server, e.g. `[0]` or `[0, 1]`, exported as `CUDA_VISIBLE_DEVICES` (not beside "
             "`env.CUDA_VISIBLE_DEVICES`); shown by `--sglang-show`"),
    Key("sim", (dict,), "a table of simulator knobs", {}, "update", parse=rules.sim_knobs, show=Shown(
        "sim knobs", _shown_sim), help=(
        "simulator knobs for `--sglang-sim`: `startup_seconds`, `decode_tok_s`, `ttft_ms`, `max_batch`, "
        "`accept_length`, `fault` (`traceback`, `exit`, `hang`, `bad-flag`), `fault_after`, `fault_node` (the node "
        "rank a fault happens on), `fault_member` (the fleet member a fault happens on: `router`, `worker1`, "
        "`prefill0`, ...), `crash_after_requests`, `ignore_sigterm`, `jitter` (each round's pace varies by up to "
        "this fraction), `session_drift` (CV of one lognormal speed factor per pytest run, shared by all its "
        "servers; `PYTEST_SGLANG_SIM_SEED` fixes it), `wander` (the speed's slow random walk within a run, per "
        "minute), `instance_drift` (CV of one lognormal speed factor per server instance, drawn from the run's "
        "seed and the profile name: two instances of one profile differ as on the H200)")),
    Key("replicas", (int,), "an integer >= 1: data-parallel workers behind a router", parse=None,
        help="a fleet: this many data-parallel workers behind a router (see [Router and data "
             "parallel](#router-and-data-parallel))"),
    Key("router", (dict,), "a table such as { python = '/opt/router/bin/python', args = ['--policy', 'round_robin'] }",
        merge="update", parse=None, help=(
            "`{ python, command, args, env }`: a fleet's router (default `{python} -m "
            "sglang_router.launch_router`, the router's `python` else the profile's; `command = [\"smg\", "
            "\"launch\"]` for smg)")),
    Key("prefill", (dict,), _ROLE, merge="update", parse=None, help=(
        "`{ replicas, args, env, gpus }` each: a prefill/decode fleet, each role's table merged over the "
        "profile's keys (see [Prefill/decode disaggregation](#prefilldecode-disaggregation))")),
    Key("decode", (dict,), _ROLE, merge="update", parse=None),
)
PROFILE_KEYS: dict[str, Key] = {key.name: key for key in KEYS}
FIELD_KEYS: tuple[Key, ...] = tuple(key for key in KEYS if key.field)


def field_values(name: str, merged: Mapping[str, Any], where: Callable[[str | None], str]) -> dict[str, Any]:
    """The Profile fields of a profile's merged keys (after `extends` and ``${VAR}``), each checked in the
    table's order; the first mistake raises its ProfileError."""
    at = rules.At(name, merged, where)
    values: dict[str, Any] = {}
    for key in FIELD_KEYS:
        if key.name in merged and key.parse is not None:
            values[key.name] = key.parse(merged[key.name], at)
        else:
            values[key.name] = dict(key.default) if isinstance(key.default, dict) else key.default
    rules.fleet(values, at)
    return values


def shown_rows(profile: object, sim: bool, fleet: bool = False) -> list[tuple[str, str]]:
    """The (label, text) rows --sglang-show prints of a profile's keys."""
    rows = []
    for key in KEYS:
        if key.show is not None and (key.show.fleet or not fleet):
            text = key.show.text(getattr(profile, key.name), sim)
            if text is not None:
                rows.append((key.show.label, text))
    return rows


def markdown_table() -> str:
    """The README's table of profile keys: one row per key, or per run of keys that share one help text."""
    rows: list[tuple[list[str], str]] = []
    for key in KEYS:
        if key.help:
            rows.append(([key.name], key.help.replace("{default}", _default_text(key.default))
                         .replace("{merges}", _merges())))
        else:
            rows[-1][0].append(key.name)
    lines = ["| key | meaning |", "|---|---|"]
    lines += [f"| {', '.join(f'`{name}`' for name in names)} | {text} |" for names, text in rows]
    return "\n".join(lines) + "\n"


def _default_text(default: Any) -> str:
    return f"{default:g}" if isinstance(default, float) else str(default)


def _merges() -> str:
    """How `extends` merges the keys, as the README says it: "`args` appended, `env` and `sim` merged"."""
    def listed(rule: MergeRule) -> str:
        names = [f"`{key.name}`" for key in KEYS if key.merge == rule]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    return f"{listed('append')} appended, {listed('update')} merged"


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m pytest_sglang.config.schema --markdown  (the README's profile key table)",
              file=sys.stderr)
        return 2
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
