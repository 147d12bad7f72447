"""Each readiness check on its own (its observation and its own message, stepped by hand with a fake tree and
probe), and what each origin composes: a check an origin needs is in its list, one it does not is absent."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_ready import CRASH, READY_LINE, FakeClock, FakeProbe, FakeTree

from pytest_sglang.config import Profile
from pytest_sglang.config.kinds import SGLANG
from pytest_sglang.errors import ServerStartupError
from pytest_sglang.launch.plan import Readiness, plan_launch
from pytest_sglang.server.origins import attach_server, startup_wait
from pytest_sglang.server.readiness.check import (
    CRASH_SETTLE_SECONDS,
    NOT_YET,
    Deadline,
    Failed,
    Ready,
    Server,
    Subject,
)
from pytest_sglang.server.readiness.compose import Startup, members_startup, probe_startup
from pytest_sglang.server.readiness.log import LogCrash, ReadyLine, Silence
from pytest_sglang.server.readiness.peers import Followers, MemberSilence, Peer, PeerFailures, PeersUp
from pytest_sglang.server.readiness.probe import HttpReady
from pytest_sglang.server.readiness.tree import NodeEnd, TreeExit, TreeMembers
from pytest_sglang.server.ready import wait_for
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.server.slurm import _peer_health_path
from pytest_sglang.watch import LogTail, LogWatcher

T0 = 500.0
PROFILES = """
[tool.pytest_sglang.profiles.sgl]
model = "m"
[tool.pytest_sglang.profiles.gen]
kind = "generic"
command = ["serve"]
slurm = { nodes = 2 }
"""


def clock() -> float:
    return T0


def record(tmp: Path) -> StartupRecord:
    return StartupRecord(profile="tiny", kind="sglang", origin="launched", outcome="ready", host="127.0.0.1",
                         port=1, log_path=tmp / "rank0.log")


def watcher(tmp: Path, name: str = "rank0") -> LogWatcher:
    log = tmp / f"{name}.log"
    log.write_bytes(b"")
    return LogWatcher(SGLANG, started_at=T0, tail=LogTail(log))


def server(tmp: Path, *, node: str = "", tree: FakeTree | None = None) -> Server:
    return Server(template=record(tmp), started_at=T0, command=["serve"], node=node, process=tree or FakeTree(),
                  watcher=watcher(tmp))


def node(tmp: Path, name: str = "node 1 (b)", probe: FakeProbe | None = None) -> Peer:
    return Peer(name=name, watcher=watcher(tmp, name.split()[1]), probe=probe, log_path=tmp / f"{name}.log")


def error_of(observed: Failed | None) -> ServerStartupError:
    assert isinstance(observed, Failed)
    return observed.error


def test_the_deadline_fails_past_its_timeout_with_the_origins_headline(tmp_path: Path) -> None:
    deadline = Deadline(Subject(template=record(tmp_path), started_at=T0), 10.0, lambda now: "not up at all",
                        lambda: ["wait longer"])
    assert deadline.failed(T0 + 10.0, clock) is None and deadline.ready(T0, clock) == Ready()
    error = error_of(deadline.failed(T0 + 10.5, clock))
    assert error.headline == "not up at all" and error.hints == ["wait longer"] and error.elapsed == 10.5


def test_the_probe_is_asked_at_its_pace_and_its_answer_is_the_moment_of_readiness(tmp_path: Path) -> None:
    probe = FakeProbe()
    check = HttpReady(Subject(template=record(tmp_path), started_at=T0), probe)
    assert check.ready(T0, clock) is NOT_YET and probe.asked == 1
    assert check.ready(T0 + 0.1, clock) is NOT_YET and probe.asked == 1  # not before its pace
    probe.answers = True
    assert check.ready(T0 + 0.3, lambda: T0 + 0.4) == Ready(at=T0 + 0.4) and probe.asked == 2


def test_a_probe_refused_for_the_stall_timeout_fails_naming_the_path(tmp_path: Path) -> None:
    probe = FakeProbe(last="HTTP 404", paths=("/healthz",))
    probe.refusing_for = lambda now: now - T0  # type: ignore[method-assign]
    check = HttpReady(Subject(template=record(tmp_path), started_at=T0), probe, refuse_after=5.0)
    assert check.failed(T0 + 4.0, clock) is None
    error = error_of(check.failed(T0 + 5.0, clock))
    assert error.headline == ("GET /healthz answered 404 for 5 s while the server ran: is health_path right? "
                              "(stall_timeout 5 s)")
    assert HttpReady(check.subject, probe).failed(T0 + 99.0, clock) is None  # no stall timeout: no refusal


def test_a_logged_crash_holds_readiness_and_fails_once_settled_on_its_node(tmp_path: Path) -> None:
    head = server(tmp_path, node="node 0 (a)")
    check = LogCrash(head)
    assert check.ready(T0, clock) == Ready()
    head.watcher.feed(CRASH, T0 + 1.0)
    assert check.ready(T0 + 1.0, clock) is NOT_YET and check.failed(T0 + 1.0, clock) is None
    error = error_of(check.failed(T0 + 1.0 + CRASH_SETTLE_SECONDS, clock))
    assert error.headline.startswith("node 0 (a): server crashed during startup (its process was still alive")
    assert error.member == "node 0 (a)" and any("CUDA out of memory" in c for c in error.diagnosis.root_causes)


def test_the_ready_line_is_awaited_where_the_plan_says_and_gives_its_moment(tmp_path: Path) -> None:
    head = server(tmp_path)
    assert ReadyLine(head, awaited=True).ready(T0, clock) is NOT_YET
    assert ReadyLine(head, awaited=False).ready(T0, clock) == Ready(at=None)
    head.watcher.feed([READY_LINE], T0 + 7.0)
    assert ReadyLine(head, awaited=True).ready(T0 + 8.0, clock) == Ready(at=T0 + 7.0)


def test_the_tree_exit_is_named_after_the_node_that_ended_of_itself(tmp_path: Path) -> None:
    tree = FakeTree()
    head, node1 = server(tmp_path, node="node 0 (a)", tree=tree), node(tmp_path)
    plain = TreeExit(head, [node1])
    assert plain.failed(T0, clock) is None
    tree.code = 1
    error = error_of(plain.failed(T0 + 2.0, clock))
    assert error.headline == "node 0 (a): server exited during startup" and error.diagnosis.exit_code == 1
    ends = [NodeEnd("node 1 (b)", 3, "srun: error: b: task 1: Exited with exit code 3", stopped=False)]
    error = error_of(TreeExit(head, [node1], lambda: ends).failed(T0 + 2.0, clock))
    assert error.headline == "node 1 (b) exited during startup" and error.diagnosis.exit_code == 3
    assert error.log_path == node1.log_path and any("srun: error: b" in hint for hint in error.hints)


def test_a_tree_that_tracks_no_members_never_fails_on_them(tmp_path: Path) -> None:
    assert TreeMembers(server(tmp_path)).failed(T0 + 60.0, clock) is None  # a tree on an ssh host


def test_peers_up_waits_for_the_probed_node_and_followers_come_up_with_rank0(tmp_path: Path) -> None:
    probed, follower = node(tmp_path, probe=FakeProbe()), node(tmp_path, "node 2 (c)")
    peers = [probed, follower]
    up = PeersUp(peers)
    assert up.ready(T0, clock) is NOT_YET and not follower.up  # a follower is never asked
    assert probed.probe is not None
    probed.probe.answers = True  # type: ignore[attr-defined]
    assert up.ready(T0 + 0.3, clock) == Ready() and probed.up and not follower.up
    assert Followers(peers).ready(T0 + 0.4, clock) == Ready() and follower.up and follower.up_at == T0 + 0.4


def test_a_peers_settled_crash_is_its_own_failure(tmp_path: Path) -> None:
    node1 = node(tmp_path)
    check = PeerFailures(Subject(template=record(tmp_path), started_at=T0), [node1])
    node1.watcher.feed(CRASH, T0 + 1.0)
    error = error_of(check.failed(T0 + 1.0 + CRASH_SETTLE_SECONDS, clock))
    assert error.headline == "node 1 (b) crashed during startup (the server has been stopped on every node)"
    assert error.member == "node 1 (b)" and error.log_path == node1.log_path


def test_a_silent_fleet_member_is_named_with_its_phase(tmp_path: Path) -> None:
    member = node(tmp_path, "worker 1")
    error = error_of(MemberSilence(Subject(template=record(tmp_path), started_at=T0), [member], 4.0)
                     .failed(T0 + 4.0, clock))
    assert error.headline == "worker 1 has logged nothing new for 4 s in phase starting (stall_timeout 4 s)"


def kinds(startup: Startup) -> list[type]:
    return [type(check) for check in startup.checks]


def launched(profile: Profile, tmp: Path, peers: list[Peer]) -> Startup:
    plan = plan_launch(profile, sim=False, log_dir=tmp, check=False)
    return startup_wait(plan, template=record(tmp), process=FakeTree(), watcher=watcher(tmp),
                        base_url=plan.base_url, command=["serve"], look_at="the log", peers=peers,
                        node="node 0 (a)" if peers else "")


def test_a_launched_server_composes_its_tree_log_probe_and_silence(profiles: dict[str, Profile],
                                                                  tmp_path: Path) -> None:
    assert kinds(launched(profiles["sgl"], tmp_path, [])) == [
        TreeExit, LogCrash, TreeMembers, Deadline, ReadyLine, HttpReady, Silence]


def test_a_generic_slurm_profiles_nodes_are_composed_and_a_silent_one_is_named(profiles: dict[str, Profile],
                                                                               tmp_path: Path) -> None:
    """The nodes of a generic profile without health_path serve no HTTP, so nothing can ask them: they are
    composed all the same (awaited until rank 0 is ready), and a node that never joins is named at the stall
    timeout while rank 0 keeps logging."""
    plan = plan_launch(profiles["gen"], sim=False, log_dir=tmp_path, check=False)
    assert _peer_health_path(plan) is None
    node1 = node(tmp_path)
    startup = launched(profiles["gen"], tmp_path, [node1])
    assert kinds(startup) == [TreeExit, PeerFailures, LogCrash, TreeMembers, Deadline, PeersUp, ReadyLine,
                              HttpReady, Silence, Followers]
    exit_check = startup.checks[0]
    assert isinstance(exit_check, TreeExit)
    head = exit_check.server

    def rank0_says(t: int) -> Callable[[], None]:
        return lambda: head.watcher.feed([f"waiting for 1 more node(s) {t}"], T0 + t)

    waiting = [(float(t), rank0_says(t)) for t in range(1, 400)]
    fake = FakeClock(waiting)
    records: list[StartupRecord] = []
    with pytest.raises(ServerStartupError) as caught:
        wait_for(startup, on_status=lambda _: None, on_record=records.append, clock=fake, sleep=fake.sleep)
    assert caught.value.headline.startswith(f"node 1 (b) has logged nothing new for {plan.stall_timeout:.0f} s")
    assert caught.value.log_path == node1.log_path and [r.outcome for r in records] == ["failed"]


def test_an_attached_or_kept_server_composes_its_probe_alone(tmp_path: Path) -> None:
    subject = Subject(template=record(tmp_path), started_at=T0)
    assert kinds(probe_startup(subject, probe=FakeProbe(), timeout=5.0)) == [Deadline, HttpReady]
    now = Subject(template=record(tmp_path), started_at=time.monotonic())
    kept = probe_startup(now, probe=None, timeout=5.0)  # a plan that asks no HTTP: ready at once
    assert kinds(kept) == [Deadline]
    assert wait_for(kept, on_status=lambda _: None, on_record=lambda _: None).outcome == "ready"


def test_a_fleets_servers_compose_each_others_failures_and_silence(tmp_path: Path) -> None:
    subject = Subject(template=record(tmp_path), started_at=T0)
    startup = members_startup(subject, [node(tmp_path, "worker 1")], timeout=5.0, stall_timeout=4.0,
                              headline=lambda now: "fleet not ready")
    assert kinds(startup) == [PeerFailures, Deadline, PeersUp, MemberSilence]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_attached_server_is_ready_once_its_probe_answers_over_http(health_server: str) -> None:
    handle = attach_server(health_server, profile="up", kind="generic")
    assert handle.record.outcome == "ready" and handle.record.origin == "attached"


def test_an_attached_server_that_refuses_its_path_says_what_it_answered(health_server: str) -> None:
    with pytest.raises(ServerStartupError) as caught:
        attach_server(health_server, profile="up", readiness=Readiness(None, ("/nope",)), timeout=0.5)
    assert caught.value.headline == (f"--sglang-url server does not answer GET /nope with 200 at {health_server} "
                                     "(last answer: HTTP 404)")
    assert caught.value.hints == ["start the server first, or drop --sglang-url to let the plugin launch it"]
