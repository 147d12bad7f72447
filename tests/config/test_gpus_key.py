"""The profile key `gpus`: validated, exported as CUDA_VISIBLE_DEVICES at launch, shown by --sglang-show."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.errors import ProfileError
from pytest_sglang.harness.settings import Settings
from pytest_sglang.harness.show import profile_lines
from pytest_sglang.launch.plan import plan_launch


def profiles(tmp_path: Path, body: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(body)
    return tmp_path


def test_gpus_reach_the_server_environment_and_show(tmp_path: Path) -> None:
    root = profiles(tmp_path, '[tool.pytest_sglang.profiles.a]\ngpus = [1, 0]\n'
                              '[tool.pytest_sglang.profiles.b]\nextends = "a"\ngpus = [2]\n')
    found = load_profiles(root, None).profiles
    assert found["a"].launch_env == {"CUDA_VISIBLE_DEVICES": "1,0"}
    plan = plan_launch(found["b"], sim=True, log_dir=tmp_path, startup_timeout=None)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2"
    settings = Settings(rootdir=root, profiles=("a",), sim=True, url=None, startup_timeout=None,
                        log_dir_option=str(tmp_path), config_path=None, reuse=False, concurrent_profiles=False,
                        distributed=False, baseline_path=None, update_baseline=False, baseline_strict=False,
                        report_path=None, gate_defaults={})
    lines, ok = profile_lines(found["a"], settings)
    assert ok and any(line.split() == ["gpus", "1,", "0", "(CUDA_VISIBLE_DEVICES=1,0)"] for line in lines), lines


@pytest.mark.parametrize(("value", "says"), [("[]", "not a list of distinct GPU indices"),
                                             ("[0, 0]", "not a list of distinct GPU indices"),
                                             ("[-1]", "not a list of distinct GPU indices"),
                                             ('["0"]', "not a list of distinct GPU indices"),
                                             ("0", "a list of GPU indices")])
def test_bad_gpus_say_what_to_write(tmp_path: Path, value: str, says: str) -> None:
    root = profiles(tmp_path, f"[tool.pytest_sglang.profiles.a]\ngpus = {value}\n")
    with pytest.raises(ProfileError, match=says):
        load_profiles(root, None)


def test_gpus_and_cuda_visible_devices_together_is_an_error(tmp_path: Path) -> None:
    root = profiles(tmp_path, '[tool.pytest_sglang.profiles.a]\ngpus = [0]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n')
    with pytest.raises(ProfileError, match="both `gpus` and env.CUDA_VISIBLE_DEVICES; keep one"):
        load_profiles(root, None)
