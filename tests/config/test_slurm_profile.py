"""The `slurm` profile key: validated with errors that name the key, merged through `extends`, planned into one
srun step per kind (sglang, vllm, generic) and shown by --sglang-show, all without a cluster."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from pytest_sglang.config.profiles import load_profiles
from pytest_sglang.errors import ProfileError
from pytest_sglang.launch.plan import plan_launch
from pytest_sglang.launch.slurm import NODE_TASK, plan_slurm

TOKEN = "f" * 32


def _load(tmp_path: Path, body: str, name: str = "two"):  # type: ignore[no-untyped-def]
    (tmp_path / "pyproject.toml").write_text(body)
    return load_profiles(tmp_path, None).profiles[name]


@pytest.mark.parametrize(("slurm", "message"), [
    ("{ gpus_per_node = 8 }", "slurm needs `nodes`"),
    ("{ nodes = 0 }", "slurm.nodes: must be an integer >= 1: the nodes the server spans, one task on each, got 0."),
    ("{ nodes = 2, time = 'two hours' }", "slurm.time: must be a time limit such as '02:00:00'"),
    ("{ nodes = 2, args = '--account=ml' }", "slurm.args: must be a list of extra srun arguments"),
    ("{ nodes = 2, partiton = 'gpu' }", "unknown key slurm.partiton"),
    ("{ nodes = 2, queue_timeout = -1 }", "slurm.queue_timeout: must be seconds"),
])
def test_bad_slurm_tables_name_the_key(tmp_path: Path, slurm: str, message: str) -> None:
    with pytest.raises(ProfileError, match="profile 'two'") as caught:
        _load(tmp_path, f"[tool.pytest_sglang.profiles.two]\nslurm = {slurm}\n")
    assert message in str(caught.value)


def test_slurm_and_ssh_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="either on an ssh host or through SLURM"):
        _load(tmp_path, "[tool.pytest_sglang.profiles.two]\nssh = 'gpu1'\nslurm = { nodes = 2 }\n")


def test_extends_merges_the_slurm_table(tmp_path: Path) -> None:
    profile = _load(tmp_path, "[tool.pytest_sglang.profiles.base]\n"
                              "slurm = { nodes = 2, gpus_per_node = 8, partition = 'gpu', args = ['--account=ml'] }\n"
                              "[tool.pytest_sglang.profiles.four]\nextends = 'base'\nslurm = { nodes = 4 }\n", "four")
    assert profile.slurm is not None
    assert (profile.slurm.nodes, profile.slurm.gpus_per_node, profile.slurm.partition, profile.slurm.args) == \
        (4, 8, "gpu", ("--account=ml",))


def _plan(tmp_path: Path, body: str, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    profile = _load(tmp_path, body)
    plan = plan_launch(profile, sim=False, log_dir=tmp_path / "logs")
    return plan, plan_slurm(plan, TOKEN, environ=environ or {})


def test_sglang_gets_its_multinode_flags_expanded_in_the_task(tmp_path: Path) -> None:
    plan, splan = _plan(tmp_path, "[tool.pytest_sglang.profiles.two]\nargs = ['--tp', '16']\n"
                                  f"python = '{sys.executable}'\n"
                                  "slurm = { nodes = 2, gpus_per_node = 8, partition = 'gpu', time = '02:00:00', "
                                  "args = ['--account=ml'] }\n")
    argv = splan.argv
    assert argv[:9] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        f"--job-name=pytest-sglang-two-{TOKEN[:8]}", "--open-mode=append",
                        f"--output={tmp_path / 'logs' / 'two.node%n.log'}", "--partition=gpu"]
    assert argv[9:12] == ["--time=02:00:00", "--gpus-per-node=8", "--account=ml"]
    assert argv[12:16] == ["bash", "-c", NODE_TASK, "pytest-sglang-node"]
    assert argv[16] == f"{plan.port},{splan.ports[1]}"
    server = argv[17:]
    assert server[server.index("--port") + 1] == "{node_port}"
    assert server[-6:] == ["--nnodes", "2", "--node-rank", "{node_rank}", "--dist-init-addr",
                           f"{{head_host}}:{splan.dist_port}"]
    assert "$SLURM_NODEID" not in shlex.join(server)  # expanded in the task, never by a shell before srun


def test_inside_an_allocation_the_step_runs_in_it(tmp_path: Path) -> None:
    _, splan = _plan(tmp_path, "[tool.pytest_sglang.profiles.two]\nslurm = { nodes = 2, partition = 'gpu', "
                               f"time = '1:00' }}\npython = '{sys.executable}'\n", environ={"SLURM_JOB_ID": "77"})
    assert splan.inside_job == "77"
    assert not any(a.startswith(("--partition", "--time")) for a in splan.argv)


def test_generic_gets_node_rank_nnodes_and_head_host(tmp_path: Path) -> None:
    _, splan = _plan(tmp_path, "[tool.pytest_sglang.profiles.two]\nkind = 'generic'\nslurm = { nodes = 3 }\n"
                               "command = ['{python}', 'serve.py', '--rank={node_rank}', '--world={nnodes}', "
                               "'--master={head_host}:{dist_port}', '--port={port}']\n")
    server = splan.argv[splan.argv.index("pytest-sglang-node") + 2:]
    assert server[1:] == ["serve.py", "--rank={node_rank}", "--world=3", f"--master={{head_host}}:{splan.dist_port}",
                          "--port={node_port}"]
    assert len(splan.ports) == len(set(splan.ports)) == 3


def test_only_port_flags_become_the_nodes_own_port(tmp_path: Path) -> None:
    _, splan = _plan(tmp_path, "[tool.pytest_sglang.profiles.two]\nkind = 'generic'\nport = 4096\n"
                               "slurm = { nodes = 2 }\ncommand = ['{python}', 'serve.py', '--port', '{port}', "
                               "'--max-tokens', '{port}', '--http-port={port}', '--size=4096']\n")
    server = splan.argv[splan.argv.index("pytest-sglang-node") + 2:]
    assert server[1:] == ["serve.py", "--port", "{node_port}", "--max-tokens", "4096", "--http-port={node_port}",
                          "--size=4096"]


def test_vllm_without_multinode_flags_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="has no multiprocessing multi-node flags .*upgrade vLLM"):
        _plan(tmp_path, f"[tool.pytest_sglang.profiles.two]\nkind = 'vllm'\npython = '{sys.executable}'\n"
                        "slurm = { nodes = 2 }\n")


def test_show_prints_the_srun_line(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.pytest_sglang.profiles.two]\nargs = ['--tp', '2']\nslurm = { nodes = 2 }\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-show", "--sglang-sim", timeout=60)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["  srun * srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 *"
                                 "--dist-init-addr '{head_host}:*'  [[]a job of its own (SLURM_JOB_ID is unset); "
                                 "node N listens on port N of *, logs two.node0.log ... two.node1.log]"])


def test_vllm_with_multinode_flags_gets_them_and_headless_on_the_others(tmp_path: Path) -> None:
    python = os.environ.get("PYTEST_SGLANG_VLLM_PYTHON", "")
    if not python or not Path(python).exists():
        pytest.skip("no vLLM interpreter (PYTEST_SGLANG_VLLM_PYTHON): .ci/run installs one")
    _, splan = _plan(tmp_path, f"[tool.pytest_sglang.profiles.two]\nkind = 'vllm'\npython = '{python}'\n"
                               "slurm = { nodes = 2 }\n")
    assert splan.argv[-9:] == ["--nnodes", "2", "--node-rank", "{node_rank}", "--master-addr", "{head_host}",
                               "--master-port", str(splan.dist_port), "{headless}"]


def test_reuse_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.pytest_sglang.profiles.two]\nslurm = { nodes = 2 }\n")
    pytester.makepyfile("def test_it(sglang_server):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--sglang-profile=two",
                                           "--sglang-reuse", timeout=60)
    result.stdout.fnmatch_lines(["*--sglang-reuse: profile 'two' runs through SLURM, and such servers are not kept "
                                 "across runs yet: drop --sglang-reuse for it*"])


def test_xdist_worker_and_missing_srun_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_sglang.errors import PluginError, SlurmError
    from pytest_sglang.server.slurm import launch_slurm_server
    from pytest_sglang.server.source import Asked, server_source

    profile = _load(tmp_path, "[tool.pytest_sglang.profiles.two]\nslurm = { nodes = 2 }\n")
    plan = plan_launch(profile, sim=True, log_dir=tmp_path / "logs")
    with pytest.raises(PluginError, match="Run its tests with -n 0"):
        server_source(profile, Asked(xdist=True))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match="this machine has no srun on its PATH"):
        launch_slurm_server(plan)
