"""The profile schema (config/schema.py) is the one place a key is written: the Profile's fields, the README's
key table and --sglang-show's key rows are read from it, and the loader checks and merges by it."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from pytest_sglang.config.profiles import Profile, load_profiles
from pytest_sglang.config.schema import FIELD_KEYS, KEYS, PROFILE_KEYS, markdown_table, shown_rows
from pytest_sglang.errors import ProfileError

README = Path(__file__).parents[2] / "README.md"
REGENERATE = "python -m pytest_sglang.config.schema --markdown"


def _readme_table() -> str:
    return README.read_text(encoding="utf-8").split("### Profile keys\n\n", 1)[1].split("\n\n", 1)[0] + "\n"


def test_the_readme_key_table_is_the_one_the_schema_makes() -> None:
    assert _readme_table() == markdown_table(), f"README.md's profile key table is stale: paste in {REGENERATE}"


def test_the_regenerate_command_prints_the_table() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_sglang.config.schema", "--markdown"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == markdown_table() and not done.stderr, done.stderr
    wrong = subprocess.run([sys.executable, "-m", "pytest_sglang.config.schema"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert wrong.returncode == 2 and "--markdown" in wrong.stderr


def test_the_profile_fields_are_the_schema_keys_with_their_defaults() -> None:
    own = {"name", "source", "unset"}
    profile_fields = {f.name: f for f in fields(Profile) if f.name not in own}
    assert set(profile_fields) == {key.name for key in FIELD_KEYS}
    for key in FIELD_KEYS:
        f = profile_fields[key.name]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        assert default == key.default, key.name
    assert [key.name for key in KEYS] == list(PROFILE_KEYS)
    assert [key.name for key in KEYS if not key.field] == ["extends"]


def test_the_table_names_every_key_once_in_the_schema_order() -> None:
    rows = markdown_table().splitlines()[2:]
    named = [name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ")[0])]
    assert named == list(PROFILE_KEYS)
    assert not any("{default}" in row or "{merges}" in row for row in rows)


def _write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(body, encoding="utf-8")
    return tmp_path


def test_extends_merges_each_key_by_its_rule(tmp_path: Path) -> None:
    root = _write(tmp_path, "[tool.pytest_sglang.profiles.a]\n"
                            'args = ["--a"]\nenv = { A = "1", B = "1" }\nsim = { ttft_ms = 5 }\nhost = "0.0.0.0"\n'
                            'ssh_options = ["-p", "1"]\nslurm = { nodes = 2, partition = "gpu" }\n'
                            "[tool.pytest_sglang.profiles.b]\nextends = \"a\"\n"
                            'args = ["--b"]\nenv = { B = "2" }\nsim = { max_batch = 3 }\nhost = "127.0.0.2"\n'
                            'ssh_options = ["-q"]\nslurm = { time = "10" }\n')
    child = load_profiles(root, None).profiles["b"]
    rules = {key.name: key.merge for key in KEYS}
    assert rules["args"] == "append" and child.args == ("--a", "--b")
    assert rules["env"] == "update" and child.env == {"A": "1", "B": "2"}
    assert rules["sim"] == "update" and child.sim == {"ttft_ms": 5, "max_batch": 3}
    assert rules["slurm"] == "update" and child.slurm is not None
    assert (child.slurm.nodes, child.slurm.partition, child.slurm.time) == (2, "gpu", "10")
    assert rules["host"] == rules["ssh_options"] == "replace"
    assert child.host == "127.0.0.2" and child.ssh_options == ("-q",)


@pytest.mark.parametrize(("body", "says"), [
    ('kind = "generic"\nport = 0', "key 'command': kind 'generic' needs a `command`"),
    ('port = 0\nready_pattern = "("', "key 'port': 0 is not a TCP port"),
    ('ssh = "-x"\nsim = { nope = 1 }', "key 'ssh': '-x' is not an ssh destination"),
    ('ssh = "h"\nslurm = { nope = 1 }', "key 'slurm': a profile runs either on an ssh host or through SLURM"),
    ('gpus = [0]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\ncpus = "3-1"', "key 'cpus': '3-1' is not a CPU list"),
    ('gpus = [0]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\nsim = { nope = 1 }', "key 'gpus': the profile sets both"),
])
def test_of_two_mistakes_in_merged_values_the_first_in_the_tables_order_is_told(tmp_path: Path, body: str,
                                                                                 says: str) -> None:
    root = _write(tmp_path, f"[tool.pytest_sglang.profiles.a]\n{body}\n")
    with pytest.raises(ProfileError) as caught:
        load_profiles(root, None)
    assert says in str(caught.value) and "1 mistake in 1 profile" in str(caught.value)


def test_show_prints_the_keys_that_have_a_row(tmp_path: Path) -> None:
    root = _write(tmp_path, '[tool.pytest_sglang.profiles.a]\ngpus = [1, 0]\ncpus = "0-1"\nenv = { HF_TOKEN = "x" }\n'
                            "[tool.pytest_sglang.profiles.b]\n")
    found = load_profiles(root, None).profiles
    assert shown_rows(found["a"], sim=True) == [
        ("env", "HF_TOKEN=***"), ("cpus", "0, 1 (the launched tree's CPU affinity)"),
        ("gpus", "1, 0 (CUDA_VISIBLE_DEVICES=1,0)"), ("sim knobs", "(defaults)")]
    assert shown_rows(found["b"], sim=False) == [
        ("env", "(none beyond pytest's own environment)"), ("sim knobs", "(defaults) (used only with --sglang-sim)")]
    assert shown_rows(found["a"], sim=False, fleet=True) == [("env", "HF_TOKEN=***")]
