"""Fleets of real SGLang 0.5.23 servers on the CPU behind a real sglang-router 0.3.2 (issue 25).

One inner pytest session per topology, several inner tests in it, as a user's suite shares its servers:
  router  `replicas = 2`: two SGLang workers behind `sglang_router.launch_router`. The inner tests check the
          members and the router's readiness, compare greedy outputs through the router with each worker's
          own, run `sglang_bench` through the router and read each worker's /metrics to see both served, then
          SIGKILL worker1: the next inner test must fail naming it.
  pd      `prefill`/`decode` tables: a prefill and a decode member (mooncake over TCP, see
          docs/fleet-real.md) behind `launch_router --pd-disaggregation`. Its greedy outputs must equal a
          plain server's: worker0 of the router session, the same model and flags without disaggregation. A
          small benchmark through it must show both members served every request.
After each session, no process carrying its TEST_MARK may be left.

The plugin picks every port, passes `--disaggregation-mode` and the bootstrap port to PD members and the
member URLs to the router; everything else below (transfer backend, SGLANG_* variables, PYTHONPATH for
mooncake, router health-check flags) is what a user writes in the profile.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from realservers import (
    READY_LINE,
    STUB_DIR,
    InnerProject,
    InnerRun,
    TinyModels,
    pd_extras,
    profile_toml,
    reap,
    server_python,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

PROMPTS = ["The capital city of France is", "Hello, my name is", "1 2 3 4 5", "Once upon a time"]
BENCH = {"num_requests": 12, "concurrency": 4, "input_len": 16, "output_len": 16, "warmup": 1}
# Without these the router marks a worker healthy or dead on its 60 s default interval (docs/fleet-real.md);
# round_robin sends every other request to each worker and retries a failed one on the other.
ROUTER_ARGS = ["--policy", "round_robin", "--health-check-interval-secs", "2", "--health-failure-threshold", "2"]

# The inner tests' shared helpers: greedy /generate and a worker's SGLang counters (needs --enable-metrics).
INNER_COMMON = '''
import json
import os
import time

import psutil
import requests

PROMPTS = {prompts!r}


def generate(base_url, prompt):
    r = requests.post(base_url + "/generate", timeout=120, json={{
        "text": prompt, "sampling_params": {{"max_new_tokens": 16, "temperature": 0}}}})
    assert r.status_code == 200, (base_url, r.status_code, r.text)
    return r.json()["text"]


def counters(base_url):
    """A worker's own counts, summed over its label sets (SGLang serves /metrics with --enable-metrics)."""
    out = {{"num_requests_total": 0.0, "generation_tokens_total": 0.0}}
    for line in requests.get(base_url + "/metrics", timeout=30).text.splitlines():
        for name in out:
            if line.startswith("sglang:" + name + "{{"):
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def save(name, value):
    with open(os.path.join(os.environ["FLEET_OUT"], name + ".json"), "w") as f:
        json.dump(value, f)


def test_1_members_ready(sglang_server):
    members = sglang_server.members
    assert sorted(members) == sorted(EXPECTED_MEMBERS), members
    assert members["router"].base_url == sglang_server.base_url
    for name, m in members.items():
        assert m.role == name.rstrip("0123456789"), (name, m.role)
        assert psutil.pid_exists(m.pid), name
        assert m.log_path.name == f"{{sglang_server.profile}}.{{name}}.log", m.log_path
        assert m.startup_seconds > 0, (name, m.startup_seconds)
    ready = requests.get(sglang_server.url("/readiness"), timeout=10)
    assert ready.status_code == 200, ready.text
    # /readiness counts only the workers that registered: ready with 1 of 1 while the other still loads
    workers = requests.get(sglang_server.url("/workers"), timeout=10).json()["workers"]
    assert len(workers) == len(EXPECTED_MEMBERS) - 1 and all(w["is_healthy"] for w in workers), workers
    save("members", {{n: [m.role, m.base_url, m.pid] for n, m in members.items()}})


def test_2_greedy_outputs(sglang_server):
    via_router = [generate(sglang_server.base_url, p) for p in PROMPTS]
    again = [generate(sglang_server.base_url, p) for p in PROMPTS]
    assert via_router == again
    direct = {{n: [generate(m.base_url, p) for p in PROMPTS]
              for n, m in sglang_server.members.items() if m.role == "worker"}}
    for name, outputs in direct.items():
        assert outputs == via_router, name
    save("outputs", via_router)
'''

INNER_ROUTER = INNER_COMMON + '''

EXPECTED_MEMBERS = ["router", "worker0", "worker1"]
BENCH = {bench!r}


def test_3_bench_reaches_both_workers(sglang_server, sglang_bench):
    workers = {{n: m for n, m in sglang_server.members.items() if m.role == "worker"}}
    before = {{n: counters(m.base_url) for n, m in workers.items()}}
    # api="generate": sglang-router 0.3.2's /v1/completions answers 422 to a prompt of token ids
    r = sglang_bench(api="generate", **BENCH)
    n, out_len = BENCH["num_requests"], BENCH["output_len"]
    assert (r.completed, r.failed) == (n, 0)
    assert r.total_output_tokens == n * out_len
    # the plugin's own reading of each worker's /metrics over the measured requests (warmup left out)
    loads = {{name: load.to_dict() for name, load in r.members.items()}}
    save("served", loads)
    assert set(loads) == set(workers), loads
    assert sum(load["requests"] for load in loads.values()) == n, loads
    assert sum(load["generation_tokens"] for load in loads.values()) == n * out_len, loads
    assert all(load["requests"] >= 2 for load in loads.values()), loads  # round_robin: about half each
    # and this test's own reading of the same counters, warmup included
    after = {{name: counters(m.base_url) for name, m in workers.items()}}
    for name in workers:
        assert after[name]["num_requests_total"] - before[name]["num_requests_total"] >= loads[name]["requests"]


def test_4_kill_worker1(sglang_server):
    pid = sglang_server.members["worker1"].pid
    os.kill(pid, 9)
    deadline = time.monotonic() + 15
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "worker1 outlived SIGKILL"
        time.sleep(0.1)


def test_5_after_the_kill(sglang_server):
    generate(sglang_server.base_url, PROMPTS[0])
'''

INNER_PD = INNER_COMMON + '''

EXPECTED_MEMBERS = ["router", "prefill0", "decode0"]


def test_3_bench_through_the_pair(sglang_server, sglang_bench):
    r = sglang_bench(api="generate", num_requests=4, concurrency=2, input_len=16, output_len=8, warmup=1)
    assert (r.completed, r.failed, r.total_output_tokens) == (4, 0, 32)
    loads = {{name: load.to_dict() for name, load in r.members.items()}}
    save("served", loads)
    assert set(loads) == {{"prefill0", "decode0"}}, loads
    assert loads["prefill0"]["requests"] == loads["decode0"]["requests"] == 4, loads
    assert loads["decode0"]["generation_tokens"] == 32, loads  # the decode counts every output token
'''


@dataclass
class FleetRun:
    run: InnerRun
    project: InnerProject
    out: Path
    leftovers: list[str]

    def saved(self, name: str) -> object:
        path = self.out / f"{name}.json"
        assert path.exists(), f"the inner session saved no {name}.json:\n{self.run.explain()}"
        return json.loads(path.read_text())

    def member_logs(self, profile: str) -> dict[str, str]:
        return {p.name.split(".")[1]: p.read_text(errors="replace")
                for p in self.project.log_dir.glob(f"{profile}.*.log")}


def _fleet(name: str, inner: str, keys: dict[str, object], args: list[str], env: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> FleetRun:
    """Run one inner session on the fleet profile `name` (its members' args and env: SERVER_ARGS + `args`,
    the usual SGLang CPU env + `env`); reap whatever carries its mark afterwards."""
    python = server_python("sglang")
    keys = {**keys, "router": {"python": server_python("router"), "args": ROUTER_ARGS}}
    mark = uuid.uuid4().hex
    project = InnerProject(tmp_path_factory.mktemp(name), mark)
    model = tiny_models.get("small_vocab", python)
    project.write("profiles.toml", profile_toml(name, "sglang", python=python, model=model, mark=mark,
                                                extra_args=args, extra_env=env, keys=keys))
    project.write("test_inner.py", inner)
    out = project.path / "out"
    out.mkdir()
    try:
        run = project.run(f"--sglang-profile={name}", tag=name, env={"FLEET_OUT": str(out)})
    finally:
        leftovers = reap(mark, timeout=30)
    return FleetRun(run, project, out, leftovers)


@pytest.fixture(scope="module")
def router_fleet(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> FleetRun:
    inner = INNER_ROUTER.format(prompts=PROMPTS, bench=BENCH)
    return _fleet("fleet", inner, {"replicas": 2}, ["--enable-metrics"], {}, tmp_path_factory, tiny_models)


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> FleetRun:
    keys = {
        "prefill": {"env": {"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1",
                            "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}},
        "decode": {"args": ["--disaggregation-decode-retraction-backup", "cpu_tensor"]},
    }
    # What both members need on a CPU (docs/fleet-real.md): once in the profile; the tables add each role's own.
    args = ["--enable-metrics", "--disaggregation-transfer-backend", "mooncake_tcp"]
    env = {"SGLANG_HOST_IP": "127.0.0.1", "PYTHONPATH": f"{STUB_DIR}:{pd_extras()}"}
    inner = INNER_PD.format(prompts=PROMPTS)
    return _fleet("pd", inner, keys, args, env, tmp_path_factory, tiny_models)


def _outcomes(fleet: FleetRun) -> dict[str, str]:
    return {n: o.outcome for n, o in fleet.run.outcomes.items()}


# -- router + 2 workers -----------------------------------------------------------------------------------------


def test_router_fleet_serves_through_the_router(router_fleet: FleetRun) -> None:
    outcomes = _outcomes(router_fleet)
    for name in ("test_1_members_ready", "test_2_greedy_outputs", "test_3_bench_reaches_both_workers",
                 "test_4_kill_worker1"):
        assert outcomes.get(name) == "passed", router_fleet.run.explain()
    served = router_fleet.saved("served")
    assert set(served) == {"worker0", "worker1"}, served


def test_killed_worker_is_named_in_the_next_test(router_fleet: FleetRun) -> None:
    after = router_fleet.run.outcome("test_5_after_the_kill")
    assert after.outcome in ("failed", "error"), router_fleet.run.explain()
    assert "worker1" in after.message, after.message
    assert "worker0" not in after.message.split("\n", 1)[0], after.message


def test_router_fleet_logs_each_member(router_fleet: FleetRun) -> None:
    logs = router_fleet.member_logs("fleet")
    assert set(logs) == {"router", "worker0", "worker1"}, sorted(logs)
    for worker in ("worker0", "worker1"):
        assert logs[worker].count(READY_LINE["sglang"]) == 1, worker
    assert "Activated" in logs["router"]  # sglang-router's "Activated 1 worker(s) (marked as healthy)"


def test_router_fleet_leaves_no_process(router_fleet: FleetRun) -> None:
    assert router_fleet.leftovers == [], router_fleet.leftovers


# -- prefill/decode pair ----------------------------------------------------------------------------------------


def test_pd_pair_serves_through_the_router(pd_fleet: FleetRun) -> None:
    assert pd_fleet.run.returncode == 0, pd_fleet.run.explain()
    assert _outcomes(pd_fleet) == {"test_1_members_ready": "passed", "test_2_greedy_outputs": "passed",
                                   "test_3_bench_through_the_pair": "passed"}, pd_fleet.run.explain()
    logs = pd_fleet.member_logs("pd")
    assert set(logs) == {"router", "prefill0", "decode0"}, sorted(logs)
    assert "CommonKVBootstrapServer started successfully" in logs["prefill0"]
    assert "End of disaggregation warmup" in logs["decode0"]


def test_pd_outputs_equal_a_plain_servers(pd_fleet: FleetRun, router_fleet: FleetRun) -> None:
    """worker0 of the router session is a plain server of the same model and flags: the KV cache really
    travelled from prefill to decode when the outputs agree."""
    assert pd_fleet.saved("outputs") == router_fleet.saved("outputs")


def test_pd_pair_leaves_no_process(pd_fleet: FleetRun) -> None:
    assert pd_fleet.leftovers == [], pd_fleet.leftovers
