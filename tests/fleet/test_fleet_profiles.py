"""Fleet profiles: replicas behind a router, prefill/decode; what each member is planned to run; bad input said
before anything launches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_sglang.config.profiles import Profile, load_profiles
from pytest_sglang.errors import ProfileError
from pytest_sglang.launch.fleet import plan_fleet


def profiles(tmp_path: Path, body: str) -> dict[str, Profile]:
    (tmp_path / "pyproject.toml").write_text(body)
    return dict(load_profiles(tmp_path, None, environ={}).profiles)


def mistake(tmp_path: Path, body: str) -> str:
    with pytest.raises(ProfileError) as info:
        profiles(tmp_path, body)
    return str(info.value)


DP = """
[tool.pytest_sglang.profiles.dp]
model = "org/tiny"
args = ["--enable-metrics"]
env = { A = "1" }
replicas = 2
router = { args = ["--policy", "round_robin"], env = { RUST_LOG = "info" } }
"""
PD = """
[tool.pytest_sglang.profiles.pd]
model = "org/tiny"
args = ["--enable-metrics"]
env = { SGLANG_HOST_IP = "127.0.0.1" }
prefill = { replicas = 2, args = ["--disaggregation-transfer-backend", "mooncake_tcp"], env = { P = "1" } }
decode = { args = ["--disaggregation-transfer-backend", "mooncake_tcp"], gpus = [1] }
"""


def test_replicas_behind_a_router_plan_one_member_each_with_its_own_port_and_log(tmp_path: Path) -> None:
    dp = profiles(tmp_path, DP)["dp"]
    assert (dp.topology, dp.replicas) == ("router", 2)
    plan = plan_fleet(dp, sim=True, log_dir=tmp_path / "logs")
    assert [m.name for m in plan.members] == ["worker0", "worker1", "router"]
    assert [m.plan.log_path.name for m in plan.members] == ["dp.worker0.log", "dp.worker1.log", "dp.router.log"]
    ports = {m.plan.port for m in plan.members}
    assert len(ports) == 3
    router = plan.router.plan.argv
    assert router[router.index("--worker-urls") + 1:] == [m.base_url for m in plan.servers]
    assert router[router.index("--policy") + 1] == "round_robin"
    metrics_port = int(router[router.index("--prometheus-port") + 1])
    assert metrics_port not in ports and router[router.index("--prometheus-host") + 1] == "127.0.0.1"
    for member in plan.servers:
        assert member.plan.argv.count("--enable-metrics") == 1
        assert member.plan.env["A"] == "1"
    assert plan.router.plan.env["RUST_LOG"] == "info"


def test_prefill_and_decode_tables_merge_over_the_profile_and_the_router_pairs_them(tmp_path: Path) -> None:
    pd = profiles(tmp_path, PD)["pd"]
    assert pd.topology == "pd"
    plan = plan_fleet(pd, sim=True, log_dir=tmp_path)
    assert [(m.name, m.role) for m in plan.members] == [
        ("prefill0", "prefill"), ("prefill1", "prefill"), ("decode0", "decode"), ("router", "router")]
    prefill, decode = plan.servers[0].plan, plan.servers[2].plan
    assert prefill.argv[prefill.argv.index("--disaggregation-mode") + 1] == "prefill"
    assert decode.argv[decode.argv.index("--disaggregation-mode") + 1] == "decode"
    bootstraps = [int(m.plan.argv[m.plan.argv.index("--disaggregation-bootstrap-port") + 1]) for m in plan.servers[:2]]
    assert len(set(bootstraps)) == 2 and not set(bootstraps) & {m.plan.port for m in plan.members}
    assert (prefill.env["P"], prefill.env["SGLANG_HOST_IP"]) == ("1", "127.0.0.1")
    assert "P" not in decode.env and decode.env["CUDA_VISIBLE_DEVICES"] == "1"
    router = plan.router.plan.argv
    assert "--pd-disaggregation" in router
    pairs = [router[i + 1:i + 3] for i, part in enumerate(router) if part == "--prefill"]
    assert pairs == [[m.base_url, str(port)] for m, port in zip(plan.servers[:2], bootstraps, strict=True)]
    assert router[router.index("--decode") + 1] == plan.servers[2].base_url


def test_extends_reaches_into_the_role_tables(tmp_path: Path) -> None:
    found = profiles(tmp_path, PD + """
[tool.pytest_sglang.profiles.pd-wide]
extends = "pd"
decode = { replicas = 3 }
""")
    wide = found["pd-wide"]
    assert wide.decode is not None and wide.decode.replicas == 3
    assert wide.prefill == found["pd"].prefill
    assert [m.name for m in plan_fleet(wide, sim=True, log_dir=tmp_path).servers][-3:] == [
        "decode0", "decode1", "decode2"]


@pytest.mark.parametrize("body, said", [
    ("replicas = 0", "'replicas': must be an integer >= 1"),
    ('replicas = "2"', "'replicas': must be an integer >= 1"),
    ("replicas = true", "'replicas': must be an integer >= 1"),
    ('prefill = { replicas = 1 }', "needs both tables; add [decode]"),
    ('decode = { replicas = 1 }', "needs both tables; add [prefill]"),
    ('replicas = 2\nprefill = {}\ndecode = {}', "drop the top-level `replicas`"),
    ('prefill = { replicas = 0 }\ndecode = {}', "prefill.replicas: must be an integer >= 1"),
    ('prefill = { args = ["--port", "30000"] }\ndecode = {}', "--port is given twice"),
    ('replicas = 2\nargs = ["--port=30000"]', "--port is given twice"),
    ('replicas = 2\nrouter = { args = ["--worker-urls", "http://x"] }', "--worker-urls is given twice"),
    ('prefill = {}\ndecode = { args = ["--model-path", "other/model"] }', "serve one model"),
    ('replicas = 2\nssh = "gpu-box"', "not on an ssh host yet"),
    ('replicas = 2\nrouter = { pyhton = "/x" }', "unknown key router.pyhton"),
    ('kind = "vllm"\nprefill = {}\ndecode = {}', "prefill/decode disaggregation is SGLang's"),
])
def test_a_fleet_mistake_is_named_before_anything_launches(tmp_path: Path, body: str, said: str) -> None:
    text = mistake(tmp_path, f'[tool.pytest_sglang.profiles.f]\nmodel = "org/m"\n{body}\n')
    assert said in text
    assert "profile 'f'" in text


def test_a_router_that_is_not_installed_is_named_before_any_member_starts(tmp_path: Path) -> None:
    dp = profiles(tmp_path, DP.replace('router = {', f'router = {{ python = "{sys.executable}",'))["dp"]
    with pytest.raises(ProfileError, match="has no sglang_router installed") as info:
        plan_fleet(dp, sim=False, log_dir=tmp_path)
    assert "pip install sglang-router" in str(info.value)
    missing = profiles(tmp_path, DP.replace('router = {', 'router = { python = "/nowhere/bin/python",'))["dp"]
    with pytest.raises(ProfileError, match="/nowhere/bin/python does not exist"):
        plan_fleet(missing, sim=False, log_dir=tmp_path)
    plan_fleet(dp, sim=True, log_dir=tmp_path)  # the simulator plays the router: nothing to install
