"""Profiles: loading, extends, ${VAR}, and errors that name the file, the line, the profile and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.errors import ProfileError


def write(tmp_path: Path, text: str, name: str = "pyproject.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_pyproject_profiles_with_extends_and_env_expansion(tmp_path: Path) -> None:
    write(tmp_path, """
[tool.pytest_sglang.profiles.baseline]
model = "${MODEL_DIR}/Kimi-K2"
args = ["--tp", "8", "--api-key", "sk-secret"]
env = { NCCL_DEBUG = "WARN" }
startup_timeout = 900

[tool.pytest_sglang.profiles.eagle3]
extends = "baseline"
args = ["--speculative-algorithm", "EAGLE3"]
env = { SGLANG_X = "${FLAG:-on}" }
""")
    profiles = load_profiles(tmp_path, None, environ={"MODEL_DIR": "/models"}).profiles
    eagle = profiles["eagle3"]
    assert eagle.model == "/models/Kimi-K2"
    assert eagle.args == ("--tp", "8", "--api-key", "sk-secret", "--speculative-algorithm", "EAGLE3")
    assert dict(eagle.env) == {"NCCL_DEBUG": "WARN", "SGLANG_X": "on"}
    assert eagle.startup_timeout == 900
    assert eagle.api_key == "sk-secret"
    assert profiles["baseline"].args == ("--tp", "8", "--api-key", "sk-secret")


def test_config_file_uses_profiles_tables(tmp_path: Path) -> None:
    config = write(tmp_path, '[profiles.small]\nkind = "vllm"\nmodel = "org/tiny"\n', "servers.toml")
    profile = load_profiles(tmp_path, config).profiles["small"]
    assert (profile.kind, profile.model, profile.host, profile.port) == ("vllm", "org/tiny", "127.0.0.1", None)


def test_a_config_file_with_pyproject_tables_is_read_as_a_pyproject(tmp_path: Path) -> None:
    config = tmp_path / "other" / "pyproject.toml"
    config.parent.mkdir()
    config.write_text('[tool.pytest_sglang.profiles.small]\nmodel = "org/small"\nstartup_timeout = 60\n')
    profile = load_profiles(tmp_path, config).profiles["small"]
    assert (profile.model, profile.startup_timeout, profile.source) == ("org/small", 60, config)
    config.write_text(config.read_text() + '[profiles.own]\nmodel = "org/own"\n')  # its own tables win
    assert list(load_profiles(tmp_path, config).profiles) == ["own"]


def test_unknown_profile_lists_known_ones(tmp_path: Path) -> None:
    write(tmp_path, "[tool.pytest_sglang.profiles.baseline]\n[tool.pytest_sglang.profiles.eagle3]\n")
    with pytest.raises(ProfileError) as err:
        load_profiles(tmp_path, None).select(["eagle"])
    message = str(err.value)
    assert "Unknown profile 'eagle'" in message and "baseline, eagle3" in message
    assert "Did you mean 'eagle3'?" in message


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[tool.pytest_sglang.profiles.a]\nmodel = "x"\nargs = ["--tp", \n')
    with pytest.raises(ProfileError) as err:
        load_profiles(tmp_path, None)
    assert str(path) in str(err.value)
    assert "line" in str(err.value)


@pytest.mark.parametrize(
    ("body", "key", "line", "needle"),
    [
        ('model = "m"\nargz = ["--tp"]\n', "argz", 3, "Did you mean 'args'?"),
        ('args = "--tp 8"\n', "args", 2, "must be a list of strings"),
        ('kind = "tgi"\n', "kind", 2, "unknown kind 'tgi'"),
        ('port = 70000\n', "port", 2, "not a TCP port"),
        ('ready_pattern = "(unclosed"\n', "ready_pattern", 2, "not a valid regex"),
        ('startup_timeout = -1\n', "startup_timeout", 2, "must be positive"),
        ('sim = { fault = "segfault" }\n', "sim", 2, "fault 'segfault' is not one of"),
        ('sim = { session_drift = -0.2 }\n', "sim", 2, "session_drift must be >= 0, got -0.2"),
        ('sim = { wander = "slow" }\n', "sim", 2, "wander must be a number, got 'slow'"),
        ('model = "${NOT_SET_ANYWHERE}/m"\n', "model", 2, "${NOT_SET_ANYWHERE} is not set"),
    ],
)
def test_bad_values_name_file_line_profile_and_key(
    tmp_path: Path, body: str, key: str, line: int, needle: str
) -> None:
    path = write(tmp_path, "[tool.pytest_sglang.profiles.p]\n" + body)
    with pytest.raises(ProfileError) as err:
        load_profiles(tmp_path, None, environ={}).profiles["p"].require()  # an unset ${VAR} is raised when needed
    message = str(err.value)
    assert f"{path}:{line}: profile 'p', key '{key}'" in message
    assert needle in message


def test_extends_cycle_and_unknown_parent(tmp_path: Path) -> None:
    write(tmp_path, '[tool.pytest_sglang.profiles.a]\nextends = "b"\n[tool.pytest_sglang.profiles.b]\nextends = "a"\n')
    with pytest.raises(ProfileError, match="loops: a -> b -> a"):
        load_profiles(tmp_path, None)
    write(tmp_path, '[tool.pytest_sglang.profiles.a]\nextends = "nope"\n')
    with pytest.raises(ProfileError, match="extends unknown profile 'nope'. Known profiles: a"):
        load_profiles(tmp_path, None)


def test_no_pyproject_means_no_profiles(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no profiles are defined"):
        load_profiles(tmp_path, None).select(["x"])


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such file"):
        load_profiles(tmp_path, tmp_path / "nope.toml")


def test_the_readme_lists_every_profile_key_with_the_defaults_and_merge_rules_the_schema_has() -> None:
    from pytest_sglang.config.profiles import PROFILE_KEYS, Profile

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("### Profile keys", 1)[1].split("\n\n", 2)[1]
    rows = {key: line for line in table.splitlines()[2:] for key in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert set(rows) == set(PROFILE_KEYS)
    defaults = Profile(name="", source=Path())
    for key in ("startup_timeout", "stall_timeout", "shutdown_grace"):
        assert f"(default {getattr(defaults, key):g}" in rows[key]
    assert f"default `{defaults.host}`" in rows["host"] and f'`"{defaults.kind}"` (default)' in rows["kind"]
    merging = {key: rule.merge for key, rule in PROFILE_KEYS.items() if rule.merge != "replace"}
    said = rows["extends"]
    assert all(f"`{key}`" in said for key in merging)
    assert [key for key, rule in merging.items() if rule == "append"] == ["args"] and "`args` appended" in said
