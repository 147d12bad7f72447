"""The profile key `cpus`: validated at load, shown by --sglang-show, the launched tree's CPU affinity (workers
included), a clear error where it cannot apply (ssh, SLURM, a CPU this machine lacks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import marked_processes, profile_toml, wait_for_no_processes

from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.errors import ProfileError
from pytest_sglang.harness.settings import Settings
from pytest_sglang.harness.show import profile_lines
from pytest_sglang.launch.plan import plan_launch

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
LAST_CPU = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0


def profiles(tmp_path: Path, body: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(body)
    return tmp_path


def test_cpus_lists_and_ranges_load_extend_and_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAIN_CPUS", "7-9,3")
    root = profiles(tmp_path, '[tool.pytest_sglang.profiles.a]\ncpus = [2, 0, 1]\n'
                              '[tool.pytest_sglang.profiles.b]\nextends = "a"\n'
                              '[tool.pytest_sglang.profiles.c]\nextends = "a"\ncpus = "${MAIN_CPUS:-0-6}"\n')
    found = load_profiles(root, None).profiles
    assert (found["a"].cpus, found["b"].cpus, found["c"].cpus) == ((0, 1, 2), (0, 1, 2), (3, 7, 8, 9))
    fingerprint = plan_launch(found["a"], sim=True, log_dir=tmp_path, startup_timeout=None).fingerprint
    assert fingerprint != plan_launch(found["c"], sim=True, log_dir=tmp_path, startup_timeout=None).fingerprint
    settings = Settings(rootdir=root, profiles=("c",), sim=True, url=None, startup_timeout=None,
                        log_dir_option=str(tmp_path), config_path=None, reuse=False, concurrent_profiles=False,
                        distributed=False, baseline_path=None, update_baseline=False, baseline_strict=False,
                        report_path=None, gate_defaults={})
    lines, ok = profile_lines(found["c"], settings)
    assert ok and any(line.split()[:5] == ["cpus", "3,", "7,", "8,", "9"] for line in lines), lines


@pytest.mark.parametrize("value", ["[]", "[0, 0]", "[-1]", '["x"]', "[true]", "[1.5]", '""', '"3-1"', '"0,0"',
                                   '"0-"', '"a-b"', "3"])
def test_bad_cpus_say_what_to_write(tmp_path: Path, value: str) -> None:
    root = profiles(tmp_path, f"[tool.pytest_sglang.profiles.a]\ncpus = {value}\n")
    with pytest.raises(ProfileError, match=r"key 'cpus'.*(CPU indices|CPU list|such as)"):
        load_profiles(root, None)


@pytest.mark.parametrize(("where", "how"), [('ssh = "gpu-box"', "ssh"), ("slurm = { nodes = 2 }", "SLURM")])
def test_cpus_on_ssh_or_slurm_profiles_is_an_error(tmp_path: Path, where: str, how: str) -> None:
    root = profiles(tmp_path, f'[tool.pytest_sglang.profiles.a]\n{where}\ncpus = "0-3"\n')
    with pytest.raises(ProfileError, match=f"launched on this machine only, not through {how}; drop it"):
        load_profiles(root, None)


def test_the_launched_tree_and_its_workers_run_on_the_profiles_cpus(pytester: pytest.Pytester) -> None:
    mark = f"cpus-{os.getpid()}"
    pytester.makepyprojecttoml(profile_toml("pinned", mark, f'args = ["--tp", "2"]\ncpus = [{LAST_CPU}]'))
    pytester.makepyfile(f"""
        import os, time
        import psutil

        def test_affinity(sglang_server):
            root = psutil.Process(sglang_server.pid)
            deadline = time.monotonic() + 10
            while len(root.children(recursive=True)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            tree = [root, *root.children(recursive=True)]
            assert len(tree) >= 3, tree
            assert {{p.pid: p.cpu_affinity() for p in tree}} == {{p.pid: [{LAST_CPU}] for p in tree}}
            assert sorted(os.sched_getaffinity(0)) == {sorted(os.sched_getaffinity(0))}  # pytest itself not moved
    """)
    result = pytester.runpytest_subprocess("--sglang-sim", "--sglang-profile=pinned")
    result.assert_outcomes(passed=1)
    assert not wait_for_no_processes(mark)


def test_a_cpu_this_machine_lacks_fails_the_launch_with_what_to_name(pytester: pytest.Pytester) -> None:
    mark = f"nocpu-{os.getpid()}"
    pytester.makepyprojecttoml(profile_toml("far", mark, "cpus = [4095]"))
    pytester.makepyfile("def test_x(sglang_server):\n    pass\n")
    result = pytester.runpytest_subprocess("--sglang-sim", "--sglang-profile=far")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*profile 'far', key 'cpus': cpus [[]4095[]] cannot be applied on this machine*"
                                 "name CPUs that `taskset -pc $$` shows*"])
    assert not marked_processes(mark)
