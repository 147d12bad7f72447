"""What the profile keys' values must be: the checks that config/schema.py's keys name, and the fleet rule
across keys. Each raises the ProfileError a user reads (tests hold the wording).

A check of a TOML value (``scalar_items``, ``gpu_list``, ``string_values``) returns the problem, or None. A
parse takes a key's merged value (after `extends` and ``${VAR}``) and returns the Profile field's value, or
raises; the loader runs them in the table's order, so a profile's first mistake is the one told, and a rule
that spans keys sits with the key it blames, after the keys it reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from pytest_sglang.config.fleet import check_fleet, parse_role, parse_router, topology
from pytest_sglang.config.kinds import KINDS
from pytest_sglang.config.slurm import SlurmSpec, parse_slurm
from pytest_sglang.errors import ProfileError
from pytest_sglang.sim.config import FAULTS, KNOB_ENV, KnobError, Knobs, load_knobs

SIM_KNOBS = frozenset(f.name for f in fields(Knobs))
SIM_FAULTS = (None, *FAULTS)
_CPU_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class At:
    """The profile a parse is for: its name, its merged keys, and ``where(key)``, the location its errors
    start with ("FILE:LINE: profile 'p', key 'k'"; None: the profile's own line)."""

    name: str
    merged: Mapping[str, Any]
    where: Callable[[str | None], str]


def scalar_items(value: Any, desc: str) -> str | None:
    """A list whose items are strings (numbers are taken as their text)."""
    if all(isinstance(v, (str, int, float)) for v in value):
        return None
    return f"must be {desc}, got {value!r}."


def gpu_list(value: Any, desc: str) -> str | None:
    if value and len(set(value)) == len(value) and all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in value):
        return None
    return (f"{value!r} is not a list of distinct GPU indices; "
            "write e.g. gpus = [0] or gpus = [0, 1] (as nvidia-smi numbers them).")


def string_values(value: Any, desc: str) -> str | None:
    if all(isinstance(v, (str, int, float)) for v in value.values()):
        return None
    return f"values must be strings, got {value!r}."


def kind(value: Any, at: At) -> str:
    if value not in KINDS:
        raise ProfileError(f"{at.where('kind')}: unknown kind {value!r}; use one of {', '.join(map(repr, KINDS))}.")
    if value == "generic" and not at.merged.get("command"):
        raise ProfileError(f"{at.where('command')}: kind 'generic' needs a `command` to launch.")
    return str(value)


def seconds(key: str) -> Callable[[Any, At], float]:
    def parse(value: Any, at: At) -> float:
        if value <= 0:
            raise ProfileError(f"{at.where(key)}: must be positive, got {value!r}.")
        return float(value)

    return parse


def regex(value: Any, at: At) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ProfileError(f"{at.where('ready_pattern')}: not a valid regex: {exc}.") from None
    return str(value)


def port(value: Any, at: At) -> int:
    if not 0 < value < 65536:
        raise ProfileError(f"{at.where('port')}: {value} is not a TCP port (1-65535).")
    return int(value)


def ssh_destination(value: Any, at: At) -> str:
    if not value.strip() or value.startswith("-") or any(c.isspace() for c in value):
        raise ProfileError(f"{at.where('ssh')}: {value!r} is not an ssh destination: give 'user@host' or "
                           "a Host alias (ssh options go in `ssh_options`).")
    if "slurm" in at.merged:
        raise ProfileError(f"{at.where('slurm')}: a profile runs either on an ssh host or through SLURM; "
                           "drop `ssh` (srun reaches the nodes) or `slurm`.")
    return str(value)


def sim_knobs(value: Any, at: At) -> dict[str, Any]:
    for knob in value:
        if knob not in SIM_KNOBS:
            raise ProfileError(
                f"{at.where('sim')}: unknown simulator knob {knob!r}. Known: {', '.join(sorted(SIM_KNOBS))}."
            )
    if value.get("fault") not in SIM_FAULTS:
        raise ProfileError(
            f"{at.where('sim')}: fault {value['fault']!r} is not one of {', '.join(repr(f) for f in SIM_FAULTS if f)}."
        )
    try:
        load_knobs(json.dumps(value))
    except KnobError as exc:
        raise ProfileError(f"{at.where('sim')}: {str(exc).removeprefix(KNOB_ENV + ': ')}.") from None
    return dict(value)


def slurm(value: Any, at: At) -> SlurmSpec:
    return parse_slurm(at.where(None), value)


def cpus(value: Any, at: At) -> tuple[int, ...]:
    found = parse_cpus(at.where("cpus"), value)
    remote = "ssh" if at.merged.get("ssh") is not None else "SLURM" if "slurm" in at.merged else None
    if remote:
        raise ProfileError(f"{at.where('cpus')}: `cpus` is applied to servers launched on this machine "
                           f"only, not through {remote}; drop it, or pin the server in `command` (e.g. taskset -c "
                           "0-6 ...) on that host.")
    return found


def gpus(value: Any, at: At) -> tuple[int, ...]:
    if "CUDA_VISIBLE_DEVICES" in at.merged.get("env", {}):
        raise ProfileError(f"{at.where('gpus')}: the profile sets both `gpus` and "
                           "env.CUDA_VISIBLE_DEVICES; keep one (gpus is exported as CUDA_VISIBLE_DEVICES).")
    return tuple(int(g) for g in value)


def parse_cpus(where: str, value: Any) -> tuple[int, ...]:
    """``[0, 1, 2]`` or ``"0-6"`` / ``"0-3,8"`` (taskset's list form) as sorted, distinct CPU indices."""
    how = "write e.g. cpus = [0, 1, 2, 3] or cpus = \"0-6\" (CPU numbers as `nproc` and taskset count them)"
    if isinstance(value, str):
        found: list[int] = []
        for part in value.split(","):
            match = _CPU_RANGE.match(part)
            low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, -1)
            if high < low:
                raise ProfileError(f"{where}: {value!r} is not a CPU list ({part.strip()!r}); {how}.")
            found += range(low, high + 1)
    else:
        found = [int(c) for c in value if str(c).isdigit()]
        if len(found) != len(value):
            raise ProfileError(f"{where}: {value!r} is not a list of CPU indices; {how}.")
    if not found or len(set(found)) != len(found):
        raise ProfileError(f"{where}: {value!r} is not a list of distinct CPU indices; {how}.")
    return tuple(sorted(found))


def fleet(values: dict[str, Any], at: At) -> None:
    """The fleet keys (replicas, router, prefill, decode) read together, once every other key is parsed: which
    fleet they make, what it cannot take, and their Profile fields."""
    where, merged = at.where, at.merged
    shape = topology(where(None), merged)
    if shape is not None:
        check_fleet(where(None), merged)
    if shape == "pd" and values["kind"] != "sglang":
        raise ProfileError(f"{where('kind')}: prefill/decode disaggregation is SGLang's; a "
                           f"{values['kind']!r} fleet takes `replicas` behind a router instead.")
    if shape is None and values["sim"].get("fault_member") is not None:
        raise ProfileError(f"{where('sim')}: fault_member names a member of a fleet, and profile "
                           f"{at.name!r} is one server (no replicas, router or prefill/decode); drop it.")
    values["replicas"] = merged.get("replicas", 1 if shape == "router" else None)
    if shape is not None:
        values["router"] = parse_router(where(None), merged.get("router", {}))
    if shape == "pd":
        values["prefill"] = parse_role(where(None), "prefill", merged["prefill"])
        values["decode"] = parse_role(where(None), "decode", merged["decode"])
