"""The profile keys of a fleet: `replicas` workers behind a `router`, or `prefill` and `decode` tables behind one.

A fleet is one profile: one name, one readiness, one teardown (server/fleet.py). Its members are planned from
the profile's own keys with their role's table merged over them (launch/fleet.py); this module only reads and
checks the tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_sglang.errors import ProfileError

Topology = Literal["router", "pd"]
# What the plugin passes each member and the router itself: a profile that sets one would clash with it.
PLUGIN_FLAGS = ("--host", "--port", "--worker-urls", "--pd-disaggregation", "--prefill", "--decode",
                "--disaggregation-mode", "--disaggregation-bootstrap-port", "--prometheus-host", "--prometheus-port")
MODEL_FLAGS = ("--model-path", "--model")
_ROLE_FIELDS = {
    "replicas": "an integer >= 1: how many servers play this role",
    "args": "a list of strings appended to the profile's args for this role",
    "env": "a table of strings merged over the profile's env for this role",
    "gpus": "a list of GPU indices for this role's servers (each replica gets them all; split with two roles)",
}
_ROUTER_FIELDS = {
    "python": "a path to the Python interpreter that has sglang_router installed",
    "command": "a list of strings: the router program, e.g. ['smg', 'launch']",
    "args": "a list of strings: extra router flags, e.g. ['--policy', 'round_robin']",
    "env": "a table of strings merged over the profile's env for the router",
}


@dataclass(frozen=True)
class RoleSpec:
    """A `prefill` or `decode` table: how many servers play the role, and what they add to the profile's keys."""

    replicas: int = 1
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] | None = None

    def as_raw(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"replicas": self.replicas, "args": list(self.args), "env": dict(self.env)}
        if self.gpus is not None:
            raw["gpus"] = list(self.gpus)
        return raw


@dataclass(frozen=True)
class RouterSpec:
    """The `router` table: the program in front of the workers (default: sglang_router's launch_router)."""

    python: str | None = None
    command: tuple[str, ...] | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def as_raw(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"args": list(self.args), "env": dict(self.env)}
        if self.python is not None:
            raw["python"] = self.python
        if self.command is not None:
            raw["command"] = list(self.command)
        return raw


def parse_role(where: str, role: str, table: dict[str, Any]) -> RoleSpec:
    """Check a `prefill` or `decode` table; ``where`` names the profile in errors."""
    _known(where, role, table, _ROLE_FIELDS)
    replicas = table.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ProfileError(f"{where}, {role}.replicas: must be {_ROLE_FIELDS['replicas']}, got {replicas!r}.")
    args = _strings(where, f"{role}.args", table.get("args", []), _ROLE_FIELDS["args"])
    env = _table_of_strings(where, f"{role}.env", table.get("env", {}))
    gpus = table.get("gpus")
    if gpus is not None and (not isinstance(gpus, list) or not gpus or len(set(gpus)) != len(gpus) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        raise ProfileError(f"{where}, {role}.gpus: must be {_ROLE_FIELDS['gpus']}, got {gpus!r}.")
    _no_plugin_flags(where, f"{role}.args", args)
    _no_model_flags(where, f"{role}.args", args)
    return RoleSpec(replicas=replicas, args=args, env=env, gpus=tuple(gpus) if gpus is not None else None)


def parse_router(where: str, table: dict[str, Any]) -> RouterSpec:
    """Check the `router` table; ``where`` names the profile in errors."""
    _known(where, "router", table, _ROUTER_FIELDS)
    python = table.get("python")
    if python is not None and (not isinstance(python, str) or not python.strip()):
        raise ProfileError(f"{where}, router.python: must be {_ROUTER_FIELDS['python']}, got {python!r}.")
    command = table.get("command")
    if command is not None:
        command = _strings(where, "router.command", command, _ROUTER_FIELDS["command"])
        if not command:
            raise ProfileError(f"{where}, router.command: must be {_ROUTER_FIELDS['command']}, got [].")
    args = _strings(where, "router.args", table.get("args", []), _ROUTER_FIELDS["args"])
    _no_plugin_flags(where, "router.args", args)
    return RouterSpec(python=python, command=command, args=args,
                      env=_table_of_strings(where, "router.env", table.get("env", {})))


def topology(where: str, merged: Mapping[str, Any]) -> Topology | None:
    """Which fleet the merged keys describe, or None for one server; a mix that cannot work is an error."""
    replicas = merged.get("replicas")
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
        raise ProfileError(f"{where}, key 'replicas': must be an integer >= 1 (the workers behind the router), "
                           f"got {replicas!r}.")
    pd = [role for role in ("prefill", "decode") if role in merged]
    if pd and len(pd) != 2:
        missing = "decode" if pd == ["prefill"] else "prefill"
        raise ProfileError(f"{where}: a prefill/decode profile needs both tables; add [{missing}] (e.g. "
                           f"{missing} = {{ replicas = 1 }}), or drop [{pd[0]}] for a plain server.")
    if pd and replicas is not None:
        raise ProfileError(f"{where}, key 'replicas': a prefill/decode profile counts its servers in "
                           "prefill.replicas and decode.replicas; drop the top-level `replicas`.")
    if pd:
        return "pd"
    if replicas is not None or "router" in merged:
        return "router"
    return None


def check_fleet(where: str, merged: Mapping[str, Any]) -> None:
    """What a fleet cannot take from the profile's own keys: the flags the plugin passes every member, a model
    named per member, and the origins that do not launch fleets yet."""
    _no_plugin_flags(where, "args", tuple(str(a) for a in merged.get("args", ())))
    for key, origin in (("ssh", "on an ssh host"), ("slurm", "through SLURM"), ("command", "from a `command`")):
        if key in merged:
            raise ProfileError(f"{where}, key {key!r}: a fleet (replicas, router, prefill/decode) is launched here, "
                               f"member by member, not {origin} yet; drop `{key}`, or run that server as a plain "
                               "profile.")


def _known(where: str, name: str, table: dict[str, Any], fields: dict[str, str]) -> None:
    for key in table:
        if key not in fields:
            raise ProfileError(f"{where}: unknown key {name}.{key}. Known: {', '.join(fields)}.")


def _strings(where: str, key: str, value: Any, desc: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                              for v in value):
        raise ProfileError(f"{where}, {key}: must be {desc}, got {value!r}.")
    return tuple(str(v) for v in value)


def _table_of_strings(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
        raise ProfileError(f"{where}, {key}: must be a table of strings, got {value!r}.")
    return {str(k): str(v) for k, v in value.items()}


def _no_plugin_flags(where: str, key: str, args: tuple[str, ...]) -> None:
    given = [a for a in args if a.split("=", 1)[0] in PLUGIN_FLAGS]
    if given:
        raise ProfileError(f"{where}, {key}: {given[0].split('=', 1)[0]} is given twice: the plugin passes it to "
                           "every member of a fleet (each member's port, the router's workers and ports are "
                           "chosen free). Drop it from the args; the profile's `port` key fixes the router's port.")


def _no_model_flags(where: str, key: str, args: tuple[str, ...]) -> None:
    given = [a for a in args if a.split("=", 1)[0] in MODEL_FLAGS]
    if given:
        raise ProfileError(f"{where}, {key}: the members of a fleet serve one model: set `model` once in the "
                           f"profile and drop {given[0].split('=', 1)[0]} from {key}.")
