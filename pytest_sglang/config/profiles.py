"""Load, merge (`extends`) and validate server profiles. Every error names the file, the profile and the key."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from functools import partial
from pathlib import Path
from typing import Any

from pytest_sglang.config.fleet import RoleSpec, RouterSpec, Topology
from pytest_sglang.config.schema import FIELD_KEYS, PROFILE_KEYS, field_values
from pytest_sglang.config.slurm import SlurmSpec
from pytest_sglang.errors import ProfileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PYPROJECT_TABLE: tuple[str, ...] = ("tool", "pytest_sglang", "profiles")
CONFIG_TABLE: tuple[str, ...] = ("profiles",)

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Profile:
    """One resolved profile: `extends` applied, `${VAR}` expanded, every value checked. Its fields between
    ``source`` and ``unset`` are the keys of config/schema.py with their defaults (tests/config holds it)."""

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
        problem = PROFILE_KEYS[key].problem(value)
        return f"{self.where(name, key)}: {problem}" if problem else None

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
        values = field_values(name, merged, partial(self.where, name))
        return Profile(name=name, source=self.path, **values, unset=dict(self.unset.get(name, {})))


def _as_raw(profile: Profile) -> dict[str, Any]:
    """A resolved parent as the raw keys a child profile merges onto (only what the parent set)."""
    raw: dict[str, Any] = {}
    for key in FIELD_KEYS:
        value = getattr(profile, key.name)
        if value != key.default:
            if isinstance(value, (SlurmSpec, RoleSpec, RouterSpec)):
                value = value.as_raw()
            raw[key.name] = list(value) if isinstance(value, tuple) else value
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
