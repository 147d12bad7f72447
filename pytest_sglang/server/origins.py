"""Where a server handle comes from: launched by this run, or attached to with --sglang-url.

Each origin sets up what readiness waits on, lets the one readiness loop decide, and pairs the record it
returns with that origin's liveness strategy. Reuse across runs (reuse.py) builds on both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_sglang.config import KINDS, SGLANG, Profile
from pytest_sglang.errors import CpuAffinityError, Diagnosis, ServerStartupError, auth_headers, register_secret
from pytest_sglang.launch.plan import LaunchPlan, Readiness
from pytest_sglang.launch.ports import check_port_free
from pytest_sglang.launch.process import ProcessTree, ServerProcess
from pytest_sglang.launch.release import stop_and_release, wait_for_dying_holder
from pytest_sglang.server.handle import (
    FAILURE_GRACE_SECONDS,
    AttachedLiveness,
    LaunchedLiveness,
    Liveness,
    ServerHandle,
)
from pytest_sglang.server.readiness.check import Hints, no_hints
from pytest_sglang.server.readiness.tree import NodeEnd, no_ends
from pytest_sglang.server.ready import (
    Peer,
    Probe,
    RecordCallback,
    Server,
    Startup,
    StatusCallback,
    Subject,
    health_probe,
    ignore,
    probe_startup,
    server_startup,
    wait_for,
)
from pytest_sglang.server.record import StartupRecord
from pytest_sglang.server.url import server_root
from pytest_sglang.watch import LogTail, LogWatcher

ATTACH_TIMEOUT_SECONDS = 10.0
SERVER_MODULES = {"sglang": "sglang", "vllm": "vllm"}


@dataclass(frozen=True)
class LaunchedServer:
    """A server :func:`start_server` started and saw ready, before it becomes a handle: its liveness typed as a
    launched one, for a caller that keeps its process (--sglang-reuse) or shares it (an xdist worker)."""

    record: StartupRecord
    liveness: LaunchedLiveness
    api_key: str | None

    def handle(self, liveness: Liveness | None = None) -> ServerHandle:
        """The handle tests get; ``liveness``: one that wraps this server's own (an xdist worker's)."""
        return ServerHandle(self.record, liveness or self.liveness, api_key=self.api_key)


def launch_server(plan: LaunchPlan, *, on_status: StatusCallback = ignore, on_record: RecordCallback = ignore,
                  reap: bool = True) -> ServerHandle:
    """Launch the planned server for this session and return once it is ready; on any failure nothing is left
    running."""
    return start_server(plan, on_status=on_status, on_record=on_record, reap=reap).handle()


def start_server(plan: LaunchPlan, *, on_status: StatusCallback = ignore, on_record: RecordCallback = ignore,
                 reap: bool = True, keep: bool = False, guardian_pid: int | None = None) -> LaunchedServer:
    """Launch the planned server and return once it is ready; on any failure nothing is left running.

    ``keep``: the server outlives the session (--sglang-reuse), so no reaper ties it to this pytest.
    ``guardian_pid``: the process the reaper watches instead of this one (the xdist controller)."""
    profile = plan.profile
    plan.register_secrets()

    def say(text: str) -> None:
        on_status(f"[sglang {profile.name}] {text}")

    process, watcher = spawn(plan, say=say, reap=reap and not keep, guardian_pid=guardian_pid)
    template = StartupRecord(profile=profile.name, kind=plan.kind.name, origin="launched", outcome="ready",
                             host=plan.host, port=plan.port, model=profile.model, log_path=plan.log_path,
                             pid=process.pid)
    wait = startup_wait(plan, template=template, process=process, watcher=watcher, base_url=plan.base_url,
                        command=plan.argv, look_at="the last phase above and the end of the full log")
    try:
        record = wait_for(wait, on_status=on_status, on_record=on_record)
    except BaseException:  # a failed startup, Ctrl-C during a 10-minute one, pytest-timeout cutting it
        stop_and_release(process, grace=min(FAILURE_GRACE_SECONDS, profile.shutdown_grace), profile=profile.name,
                         host=plan.host, port=plan.port, on_status=say)
        raise
    health = health_probe(plan, plan.base_url)
    liveness = LaunchedLiveness(profile=profile.name, process=process, watcher=watcher, health=health,
                                log_path=plan.log_path, host=plan.host, port=plan.port,
                                shutdown_grace=profile.shutdown_grace, keep=keep, on_status=say)
    return LaunchedServer(record, liveness, profile.api_key)


def spawn(plan: LaunchPlan, *, say: StatusCallback, reap: bool = True,
          guardian_pid: int | None = None) -> tuple[ServerProcess, LogWatcher]:
    """Start the planned server's process (its port checked free first) and the watcher of its log; nothing
    waits for it here. ``reap``: tie it to this pytest (or to ``guardian_pid``), so it dies with it."""
    profile = plan.profile
    wait_for_dying_holder(plan.host, plan.port, on_status=say)  # a predecessor still on its way out
    check_port_free(plan.host, plan.port, plan.health_path)
    try:
        process = ServerProcess(plan.argv, env=plan.env, log_path=plan.log_path, reap_on_parent_death=reap,
                                guardian_pid=guardian_pid, cpus=profile.cpus)
    except CpuAffinityError as exc:
        raise CpuAffinityError(f"{profile.source}: profile {profile.name!r}, key 'cpus': {exc}") from None
    except OSError as exc:  # the program is there but cannot be run (no exec bit on a mount, a script's shebang)
        raise ServerStartupError(
            f"could not run {plan.argv[0]}: {exc.strerror or exc}", profile=profile.name, log_path=None,
            diagnosis=Diagnosis(), command=plan.argv,
            hints=[f"check that {plan.argv[0]} runs on its own: `{plan.argv[0]} --version`"]) from None
    watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=process.started_at,
                         tail=LogTail(plan.log_path))
    return process, watcher


def startup_wait(plan: LaunchPlan, *, template: StartupRecord, process: ProcessTree, watcher: LogWatcher,
                 base_url: str, command: list[str], look_at: str, peers: Sequence[Peer] = (), node: str = "",
                 ends: Callable[[], Sequence[NodeEnd]] = no_ends, more_hints: Hints = no_hints) -> Startup:
    """What a launched server's startup waits on, wherever its process runs (here, on an ssh host, over SLURM
    nodes: ``peers``, each node's ``ends`` and ``more_hints`` from its launcher)."""
    readiness = plan.readiness
    server = Server(template=template, started_at=process.started_at, command=command, node=node,
                    failure_hints=lambda code, d: [*failure_hints(plan, code, d), *more_hints(code, d)],
                    process=process, watcher=watcher)
    return server_startup(
        server, timeout=plan.startup_timeout, stall_timeout=plan.stall_timeout,
        probe=Probe(base_url, readiness.probe_paths, plan.headers) if readiness.probe_paths else None,
        await_line=readiness.line is not None, peers=peers, ends=ends,
        timeout_hints=lambda: [
            "raise startup_timeout in the profile or pass --sglang-startup-timeout=SECONDS",
            f"look at {look_at}: a hang there (NCCL init, a download) will not end by waiting longer",
        ])


def attach_readiness(profile: Profile | None) -> Readiness:
    """What an --sglang-url server is asked, to be ready and while it serves: the profile's health_path, else
    its kind's (the default kind's without a profile)."""
    kind = KINDS[profile.kind] if profile is not None else SGLANG
    return Readiness.attached(kind, profile.health_path if profile is not None else None)


def attach_server(url: str, *, profile: str, kind: str = "sglang", readiness: Readiness | None = None,
                  api_key: str | None = None, on_status: StatusCallback = ignore, on_record: RecordCallback = ignore,
                  timeout: float = ATTACH_TIMEOUT_SECONDS) -> ServerHandle:
    """A handle on a server that is already running (--sglang-url): nothing is launched or killed.
    ``readiness``: default, that of ``kind``."""
    server = server_root(url)
    register_secret(api_key)
    readiness = readiness or Readiness.attached(KINDS[kind], None)
    probe = Probe(server.root, readiness.probe_paths, auth_headers(api_key))
    template = StartupRecord(profile=profile, kind=kind, origin="attached", outcome="ready",
                             host=server.host, port=server.port)
    wait = probe_startup(
        Subject(template=template, started_at=time.monotonic()), probe=probe, timeout=timeout,
        headline=lambda now: (f"--sglang-url server does not answer GET {probe.path} with 200 at {url} "
                              f"(last answer: {probe.last or 'none'})"),
        timeout_hints=lambda: ["start the server first, or drop --sglang-url to let the plugin launch it"])
    record = wait_for(wait, on_status=on_status, on_record=on_record)
    return ServerHandle(record, AttachedLiveness(profile, probe), api_key=api_key)


def failure_hints(plan: LaunchPlan, code: int | None, diagnosis: Diagnosis) -> list[str]:
    hints = []
    module = SERVER_MODULES.get(plan.kind.name)
    said = [*diagnosis.root_causes, *diagnosis.last_lines]
    if module and not plan.sim and any(f"No module named '{module}" in line for line in said):
        hints.append(
            f"{plan.argv[0]} has no {module} installed: install {module} for it, point the profile's `python` "
            f"at an interpreter that has it, or pass --sglang-sim to run the bundled simulator instead")
    if code == 2:
        hints.append("exit code 2 is the server's command-line parser rejecting a flag: check the profile's `args`")
    if code in (-9, 137):
        hints.append("SIGKILL: SGLang kills its own tree after a child fails (see the root cause), "
                     "or the OS OOM killer did (`dmesg -T | grep -i oom`)")
    return hints
