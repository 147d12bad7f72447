"""A benchmark's real servers the way a user gets them: profiles in a TOML file, driven by ``pytest_sglang.Harness``.

``harness_for(work, {"radix": RealProfile(...)})`` writes ``work/profiles.toml`` (``[profiles.NAME]`` tables, as
``--sglang-config=FILE`` reads them) and returns a Harness over it that logs under ``work/logs``; the benchmark
then does what a script of a user does: ``harness.start()``, ``with harness.server(name) as server:``,
``harness.bench(server, ...)``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_sglang import Harness  # noqa: E402


@dataclass(frozen=True)
class RealProfile:
    kind: str
    model: str
    python: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 900.0


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string (the same escapes)


def profiles_toml(profiles: Mapping[str, RealProfile]) -> str:
    lines: list[str] = []
    for name, p in profiles.items():
        env = ", ".join(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in p.env.items())
        lines += [f"[profiles.{_toml_string(name)}]", f"kind = {_toml_string(p.kind)}",
                  f"model = {_toml_string(p.model)}", f"python = {_toml_string(p.python)}",
                  f"args = [{', '.join(map(_toml_string, p.args))}]", f"env = {{ {env} }}",
                  f"startup_timeout = {p.startup_timeout}", ""]
    return "\n".join(lines)


def harness_for(work: Path, profiles: Mapping[str, RealProfile]) -> Harness:
    config = work / "profiles.toml"
    config.write_text(profiles_toml(profiles))
    return Harness(profiles=tuple(profiles), config_path=config, rootdir=work, log_dir_option=str(work / "logs"),
                   on_status=lambda line: print(line, flush=True))
