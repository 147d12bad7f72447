"""Load, merge (`extends`) and validate server profiles. Every error names the file, the profile and the key."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal

from pytest_sglang.config.fleet import RoleSpec, RouterSpec, Topology, check_fleet, parse_role, parse_router, topology
from pytest_sglang.config.kinds import KINDS
from pytest_sglang.config.slurm import SlurmSpec, parse_slurm
from pytest_sglang.errors import ProfileError
from pytest_sglang.sim.config import FAULTS, KNOB_ENV, KnobError, Knobs, load_knobs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PYPROJECT_TABLE: tuple[str, ...] = ("tool", "pytest_sglang", "profiles")
CONFIG_TABLE: tuple[str, ...] = ("profiles",)

MergeRule = Literal["replace", "append", "update"]


@dataclass(frozen=True)
class Key:
    """One profile key: the TOML types it takes, how an error describes it, and how a profile that `extends`
    another merges it (a list appended, a table updated, the rest replaced). Its default is the Profile
    field's of the same name."""

    types: tuple[type, ...]
    desc: str
    merge: MergeRule = "replace"


PROFILE_KEYS: dict[str, Key] = {
    "kind": Key((str,), "a string: " + ", ".join(repr(k) for k in KINDS)),
    "model": Key((str,), "a string (model path or name)"),
    "args": Key((list,), "a list of strings", "append"),
    "env": Key((dict,), "a table of strings", "update"),
    "extends": Key((str,), "the name of another profile"),
    "python": Key((str,), "a path to a Python interpreter"),
    "command": Key((list,), "a list of strings"),
    "startup_timeout": Key((int, float), "a number of seconds"),
    "stall_timeout": Key((int, float), "a number of seconds"),
    "shutdown_grace": Key((int, float), "a number of seconds"),
    "ready_pattern": Key((str,), "a regular expression"),
    "health_path": Key((str,), "an HTTP path such as '/health'"),
    "host": Key((str,), "a host name or address"),
    "port": Key((int,), "a port number"),
    "sim": Key((dict,), "a table of simulator knobs", "update"),
    "ssh": Key((str,), "an ssh destination such as 'user@host' or a Host alias of ~/.ssh/config"),
    "ssh_options": Key((list,), "a list of extra ssh client arguments, e.g. ['-p', '2222']"),
    "remote_log_dir": Key((str,), "a folder on the ssh host for the server's log"),
    "gpus": Key((list,), "a list of GPU indices such as [0] or [0, 1], exported as CUDA_VISIBLE_DEVICES"),
    "slurm": Key((dict,), "a table such as { nodes = 2, gpus_per_node = 8, partition = 'gpu', time = '02:00:00' }",
                 "update"),
    "cpus": Key((list, str), "CPU indices such as [0, 1, 2, 3] or a string such as '0-6' or '0-3,8'"),
    "replicas": Key((int,), "an integer >= 1: data-parallel workers behind a router"),
    "router": Key((dict,), "a table such as { python = '/opt/router/bin/python', args = ['--policy', 'round_robin'] }",
                  "update"),
    "prefill": Key((dict,), "a table such as { replicas = 1, args = [...], env = {...} }", "update"),
    "decode": Key((dict,), "a table such as { replicas = 1, args = [...], env = {...} }", "update"),
}
SIM_KNOBS = frozenset(f.name for f in fields(Knobs))
SIM_FAULTS = (None, *FAULTS)
_CPU_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Profile:
    """One resolved profile: `extends` applied, `${VAR}` expanded, every value checked."""

    name: str
    source: Path
    kind: str = "sglang"
    model: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None
    command: tuple[str, ...] | None = None
    startup_timeout: float = 1800.0  # the hard cap
    stall_timeout: float = 300.0  # no new log output (line, phase, progress bar) for this long fails the startup
    shutdown_grace: float = 30.0
    ready_pattern: str | None = None
    health_path: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    sim: Mapping[str, Any] = field(default_factory=dict)
    ssh: str | None = None  # launch on this host over OpenSSH (launch/remote.py)
    ssh_options: tuple[str, ...] = ()
    remote_log_dir: str | None = None  # default: a folder under the host's temp dir
    gpus: tuple[int, ...] | None = None  # exported as CUDA_VISIBLE_DEVICES (two A/B servers on their own GPUs)
    slurm: SlurmSpec | None = None  # spread over nodes through one srun step (launch/slurm.py)
    cpus: tuple[int, ...] | None = None  # the launched tree's CPU affinity (two A/B servers off each other's cores)
    replicas: int | None = None  # workers behind the router (config/fleet.py)
    router: RouterSpec | None = None  # a fleet's router; set on every fleet, defaulted where the file has none
    prefill: RoleSpec | None = None
    decode: RoleSpec | None = None
    unset: Mapping[str, str] = field(default_factory=dict, repr=False)  # key -> why its ${VAR} is unset

    @property
    def launch_env(self) -> dict[str, str]:
        """What the server's environment adds: ``env``, and ``gpus`` as CUDA_VISIBLE_DEVICES."""
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return env

    @property
    def topology(self) -> Topology | None:
        """The fleet this profile launches ("router": replicas behind a router, "pd": prefill/decode), or None."""
        if self.prefill is not None:
            return "pd"
        return "router" if self.router is not None else None

    @property
    def api_key(self) -> str | None:
        """The server's --api-key value, if the profile passes one; clients must send it."""
        for i, arg in enumerate(self.args):
            if arg == "--api-key" and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith("--api-key="):
                return arg.split("=", 1)[1]
        return None

    def require(self, keys: Iterable[str] | None = None) -> None:
        """Raise the ProfileError of the first of ``keys`` (default: all) whose ``${VAR}`` is unset.

        Unset variables are only an error for what a run needs: a profile that is not selected, or a
        ``model`` under --sglang-sim, never stops a run."""
        for key, message in self.unset.items():
            if keys is None or key in keys:
                raise ProfileError(message)


@dataclass(frozen=True)
class ProfileSet:
    source: Path | None
    profiles: Mapping[str, Profile]
    broken: Mapping[str, str] = field(default_factory=dict)  # profile -> every mistake found in it

    def mistakes(self) -> str:
        """Every mistake of the file, one profile a paragraph: a user fixes them in one pass, not one a run."""
        count = sum(text.count("\n  - ") + 1 for text in self.broken.values())
        return (f"{self.source}: {count} mistake{'s' if count != 1 else ''} in "
                f"{len(self.broken)} profile{'s' if len(self.broken) != 1 else ''}:\n" +
                "\n".join(f"  - {text}" for text in self.broken.values()))

    def unselected_broken(self, names: Iterable[str]) -> list[str]:
        """Broken profiles a run with ``names`` selected does not need: warned of, never blocking it."""
        return [name for name in self.broken if name not in set(names)]

    def select(self, names: list[str], origin: str = "--sglang-profile") -> list[Profile]:
        """The profiles ``names`` (given by ``origin``: the option, or the ini option that named them)."""
        known = ", ".join(sorted(self.profiles)) or "(none defined)"
        if not self.profiles and not self.broken:
            raise ProfileError(
                f"{origin} named {','.join(names)} but no profiles are defined. Add "
                f"[tool.pytest_sglang.profiles.<name>] to pyproject.toml in the rootdir, or pass "
                f"--sglang-config=FILE with [profiles.<name>] tables."
            )
        if any(name in self.broken for name in names):
            raise ProfileError(self.mistakes())
        selected = []
        for name in names:
            if name not in self.profiles:
                hint = get_close_matches(name, list(self.profiles), n=1)
                maybe = f" Did you mean {hint[0]!r}?" if hint else ""
                raise ProfileError(
                    f"Unknown profile {name!r} (from {origin}). Known profiles in {self.source}: "
                    f"{known}.{maybe}"
                )
            selected.append(self.profiles[name])
        return selected


def load_profiles(rootdir: Path, config: Path | None, environ: Mapping[str, str] | None = None, *,
                  keep_going: bool = False) -> ProfileSet:
    """Profiles from `--sglang-config` if given, else from the rootdir's pyproject.toml (or none). Every
    profile's mistakes are found in one pass; they raise one ProfileError naming them all, or with
    ``keep_going`` (a run, which needs only its selected profiles) are kept in the set's ``broken``."""
    environ = os.environ if environ is None else environ
    if config is not None:
        path, table_path = config, CONFIG_TABLE
        if not path.is_file():
            raise ProfileError(f"--sglang-config={path}: no such file.")
    else:
        path, table_path = rootdir / "pyproject.toml", PYPROJECT_TABLE
        if not path.is_file():
            return ProfileSet(None, {})
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = f" (line {len(text.splitlines())}, the last)" if "end of document" in str(exc) else ""
        raise ProfileError(f"{path}: malformed TOML: {exc}{where}. Fix the file at that line.") from None
    if config is not None and "profiles" not in data and _table(data, PYPROJECT_TABLE):
        table_path = PYPROJECT_TABLE  # --sglang-config pointed at a pyproject.toml: its tables are named so
    raw = _table(data, table_path)
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: [{'.'.join(table_path)}] must be a table of profiles.")
    loader = _Loader(path, text, ".".join(table_path), raw, environ)
    profiles, broken = {}, {}
    for name in raw:
        try:
            profiles[name] = loader.resolve(name)
        except ProfileError as exc:
            broken[name] = str(exc)
    found = ProfileSet(path, profiles, broken)
    if broken and not keep_going:
        raise ProfileError(found.mistakes())
    return found


def _table(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    raw: Any = data
    for part in path:
        raw = raw.get(part, {}) if isinstance(raw, dict) else {}
    return raw


class _Loader:
    def __init__(self, path: Path, text: str, table: str, raw: dict[str, Any], environ: Mapping[str, str]):
        self.path, self.text, self.table, self.raw, self.environ = path, text, table, raw, environ
        self.unset: dict[str, dict[str, str]] = {}  # profile -> key -> message

    def where(self, profile: str, key: str | None = None) -> str:
        line = _find_line(self.text, f"{self.table}.{profile}", key)
        loc = f"{self.path}:{line}" if line else str(self.path)
        return f"{loc}: profile {profile!r}" + (f", key {key!r}" if key else "")

    def resolve(self, name: str, chain: tuple[str, ...] = ()) -> Profile:
        if name in chain:
            cycle = " -> ".join((*chain, name))
            raise ProfileError(f"{self.where(chain[-1], 'extends')}: `extends` loops: {cycle}.")
        table = self.raw[name]
        if not isinstance(table, dict):
            raise ProfileError(f"{self.where(name)}: must be a table, e.g. [{self.table}.{name}].")
        problems = [problem for key, value in table.items() if (problem := self.key_problem(name, key, value))]
        if problems:  # the keys that are right are still built, so their value mistakes are told in this pass too
            table = {k: v for k, v in table.items() if self.key_problem(name, k, v) is None}
        merged: dict[str, Any] = {}
        parent = table.get("extends")
        if parent is not None:
            if parent not in self.raw:  # nothing to build on: the key mistakes found so far are told with it
                known = ", ".join(sorted(self.raw))
                raise ProfileError("\n  - ".join([
                    *problems,
                    f"{self.where(name, 'extends')}: extends unknown profile {parent!r}. Known profiles: {known}."]))
            try:
                parent_profile = self.resolve(parent, (*chain, name))
            except ProfileError as exc:
                raise ProfileError("\n  - ".join([*problems, str(exc)])) from None
            merged = _as_raw(parent_profile)
            for key, message in parent_profile.unset.items():
                if key not in table or PROFILE_KEYS[key].merge != "replace":
                    self.unset.setdefault(name, {}).setdefault(key, message)
        for key, value in table.items():
            if key == "extends":
                continue
            value = self.expand(name, key, value)
            rule = PROFILE_KEYS[key].merge
            if rule == "append":
                merged[key] = [*merged.get(key, []), *value]
            elif rule == "update":
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
        try:
            built = self.build(name, merged)
        except ProfileError as exc:
            problems.append(str(exc))
        if problems:
            raise ProfileError("\n  - ".join(problems))
        return built

    def key_problem(self, name: str, key: str, value: Any) -> str | None:
        if key not in PROFILE_KEYS:
            hint = get_close_matches(key, list(PROFILE_KEYS), n=1)
            maybe = f" Did you mean {hint[0]!r}?" if hint else ""
            return f"{self.where(name, key)}: unknown key.{maybe} Known keys: {', '.join(PROFILE_KEYS)}."
        types, desc = PROFILE_KEYS[key].types, PROFILE_KEYS[key].desc
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{self.where(name, key)}: must be {desc}, got {value!r}."
        checked: Any = value  # isinstance against a tuple variable narrows to `object`
        if key in ("args", "command", "ssh_options") and not all(isinstance(v, (str, int, float)) for v in checked):
            return f"{self.where(name, key)}: must be {desc}, got {value!r}."
        if key == "gpus" and (not checked or len(set(checked)) != len(checked) or not all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in checked)):
            return (f"{self.where(name, key)}: {value!r} is not a list of distinct GPU indices; "
                    "write e.g. gpus = [0] or gpus = [0, 1] (as nvidia-smi numbers them).")
        if key == "env" and not all(isinstance(v, (str, int, float)) for v in checked.values()):
            return f"{self.where(name, key)}: values must be strings, got {value!r}."
        return None

    def expand(self, name: str, key: str, value: Any) -> Any:
        if isinstance(value, str):
            return self.expand_str(name, key, value)
        if isinstance(value, list):
            return [self.expand(name, key, v) if isinstance(v, str) else str(v) for v in value]
        if isinstance(value, dict) and key == "env":
            return {k: self.expand(name, key, str(v)) for k, v in value.items()}
        return value

    def expand_str(self, name: str, key: str, value: str) -> str:
        def sub(match: re.Match[str]) -> str:
            var, default = match.group(1), match.group(2)
            if var in self.environ:
                return self.environ[var]
            if default is not None:
                return default
            self.unset.setdefault(name, {}).setdefault(key, (
                f"{self.where(name, key)}: ${{{var}}} is not set in the environment. Export {var}, or write "
                f"${{{var}:-default}} to give a default."
            ))
            return match.group(0)

        return _VAR.sub(sub, value)

    def build(self, name: str, merged: dict[str, Any]) -> Profile:
        defaults = Profile(name=name, source=self.path)
        kind = merged.get("kind", defaults.kind)
        if kind not in KINDS:
            raise ProfileError(
                f"{self.where(name, 'kind')}: unknown kind {kind!r}; use one of {', '.join(map(repr, KINDS))}."
            )
        if kind == "generic" and not merged.get("command"):
            raise ProfileError(f"{self.where(name, 'command')}: kind 'generic' needs a `command` to launch.")
        for key in ("startup_timeout", "stall_timeout", "shutdown_grace"):
            if key in merged and merged[key] <= 0:
                raise ProfileError(f"{self.where(name, key)}: must be positive, got {merged[key]!r}.")
        port = merged.get("port")
        if port is not None and not 0 < port < 65536:
            raise ProfileError(f"{self.where(name, 'port')}: {port} is not a TCP port (1-65535).")
        if "ready_pattern" in merged:
            try:
                re.compile(merged["ready_pattern"])
            except re.error as exc:
                raise ProfileError(f"{self.where(name, 'ready_pattern')}: not a valid regex: {exc}.") from None
        ssh = merged.get("ssh")
        if ssh is not None and (not ssh.strip() or ssh.startswith("-") or any(c.isspace() for c in ssh)):
            raise ProfileError(f"{self.where(name, 'ssh')}: {ssh!r} is not an ssh destination: give 'user@host' or "
                               "a Host alias (ssh options go in `ssh_options`).")
        if ssh is not None and "slurm" in merged:
            raise ProfileError(f"{self.where(name, 'slurm')}: a profile runs either on an ssh host or through SLURM; "
                               "drop `ssh` (srun reaches the nodes) or `slurm`.")
        slurm = parse_slurm(self.where(name), merged["slurm"]) if "slurm" in merged else None
        cpus = parse_cpus(self.where(name, "cpus"), merged["cpus"]) if "cpus" in merged else None
        if cpus is not None and (ssh is not None or slurm is not None):
            raise ProfileError(f"{self.where(name, 'cpus')}: `cpus` is applied to servers launched on this machine "
                               f"only, not through {'ssh' if ssh is not None else 'SLURM'}; drop it, or pin the "
                               "server in `command` (e.g. taskset -c 0-6 ...) on that host.")
        gpus = merged.get("gpus")
        if gpus is not None:
            if "CUDA_VISIBLE_DEVICES" in merged.get("env", {}):
                raise ProfileError(f"{self.where(name, 'gpus')}: the profile sets both `gpus` and "
                                   "env.CUDA_VISIBLE_DEVICES; keep one (gpus is exported as CUDA_VISIBLE_DEVICES).")
        sim = merged.get("sim", {})
        for knob in sim:
            if knob not in SIM_KNOBS:
                raise ProfileError(
                    f"{self.where(name, 'sim')}: unknown simulator knob {knob!r}. "
                    f"Known: {', '.join(sorted(SIM_KNOBS))}."
                )
        if sim.get("fault") not in SIM_FAULTS:
            raise ProfileError(
                f"{self.where(name, 'sim')}: fault {sim['fault']!r} is not one of "
                f"{', '.join(repr(f) for f in SIM_FAULTS if f)}."
            )
        try:
            load_knobs(json.dumps(sim))
        except KnobError as exc:
            raise ProfileError(f"{self.where(name, 'sim')}: {str(exc).removeprefix(KNOB_ENV + ': ')}.") from None
        fleet = topology(self.where(name), merged)
        if fleet is not None:
            check_fleet(self.where(name), merged)
        if fleet == "pd" and kind != "sglang":
            raise ProfileError(f"{self.where(name, 'kind')}: prefill/decode disaggregation is SGLang's; a "
                               f"{kind!r} fleet takes `replicas` behind a router instead.")
        if fleet is None and sim.get("fault_member") is not None:
            raise ProfileError(f"{self.where(name, 'sim')}: fault_member names a member of a fleet, and profile "
                               f"{name!r} is one server (no replicas, router or prefill/decode); drop it.")
        return Profile(
            name=name,
            source=self.path,
            kind=kind,
            model=merged.get("model"),
            args=tuple(str(a) for a in merged.get("args", ())),
            env=dict(merged.get("env", {})),
            python=merged.get("python"),
            command=tuple(merged["command"]) if merged.get("command") else None,
            startup_timeout=float(merged.get("startup_timeout", defaults.startup_timeout)),
            stall_timeout=float(merged.get("stall_timeout", defaults.stall_timeout)),
            shutdown_grace=float(merged.get("shutdown_grace", defaults.shutdown_grace)),
            ready_pattern=merged.get("ready_pattern"),
            health_path=merged.get("health_path"),
            host=merged.get("host", defaults.host),
            port=port,
            sim=dict(sim),
            ssh=ssh,
            ssh_options=tuple(str(o) for o in merged.get("ssh_options", ())),
            remote_log_dir=merged.get("remote_log_dir"),
            gpus=tuple(int(g) for g in gpus) if gpus is not None else None,
            slurm=slurm,
            cpus=cpus,
            replicas=merged.get("replicas", 1 if fleet == "router" else None),
            router=parse_router(self.where(name), merged.get("router", {})) if fleet else None,
            prefill=parse_role(self.where(name), "prefill", merged["prefill"]) if fleet == "pd" else None,
            decode=parse_role(self.where(name), "decode", merged["decode"]) if fleet == "pd" else None,
            unset=dict(self.unset.get(name, {})),
        )


def parse_cpus(where: str, value: Any) -> tuple[int, ...]:
    """``[0, 1, 2]`` or ``"0-6"`` / ``"0-3,8"`` (taskset's list form) as sorted, distinct CPU indices."""
    how = "write e.g. cpus = [0, 1, 2, 3] or cpus = \"0-6\" (CPU numbers as `nproc` and taskset count them)"
    if isinstance(value, str):
        cpus: list[int] = []
        for part in value.split(","):
            match = _CPU_RANGE.match(part)
            low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, -1)
            if high < low:
                raise ProfileError(f"{where}: {value!r} is not a CPU list ({part.strip()!r}); {how}.")
            cpus += range(low, high + 1)
    else:
        cpus = [int(c) for c in value if str(c).isdigit()]
        if len(cpus) != len(value):
            raise ProfileError(f"{where}: {value!r} is not a list of CPU indices; {how}.")
    if not cpus or len(set(cpus)) != len(cpus):
        raise ProfileError(f"{where}: {value!r} is not a list of distinct CPU indices; {how}.")
    return tuple(sorted(cpus))


def _as_raw(profile: Profile) -> dict[str, Any]:
    """A resolved parent as the raw keys a child profile merges onto (only what the parent set)."""
    defaults = Profile(name="", source=profile.source)
    raw: dict[str, Any] = {}
    for key in PROFILE_KEYS:
        if key == "extends":
            continue
        value = getattr(profile, key)
        if value != getattr(defaults, key):
            if isinstance(value, (SlurmSpec, RoleSpec, RouterSpec)):
                value = value.as_raw()
            raw[key] = list(value) if isinstance(value, tuple) else value
    return raw


def _find_line(text: str, table: str, key: str | None) -> int | None:
    """Best-effort line number of `[table]` (or of `key = ...` inside it) for error messages."""
    header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(re.escape(p) for p in table.split(".")) + r"\s*\]")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if header.match(line):
            if key is None:
                return i + 1
            for j in range(i + 1, len(lines)):
                if re.match(rf"^\s*{re.escape(key)}\s*=", lines[j]) or re.match(
                    rf"^\s*\[\s*{re.escape(table)}\.{re.escape(key)}\s*\]", lines[j]
                ):
                    return j + 1
                if lines[j].lstrip().startswith("["):
                    break
            return i + 1
    return None
