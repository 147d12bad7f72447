"""From a profile to a ready server handle. Readiness is decided here, in `wait_until_ready`, and nowhere else."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests

from pytest_sglang.errors import (
    Diagnosis,
    ProfileError,
    ServerDiedError,
    ServerStartupError,
    register_env_secrets,
    register_secret,
)
from pytest_sglang.kinds import KINDS, SGLANG, Kind
from pytest_sglang.launch import ServerProcess, check_port_free, free_port, wait_port_free
from pytest_sglang.profiles import Profile
from pytest_sglang.watch import LogTail, LogWatcher

POLL_SECONDS = 0.02  # log and process poll: the ready-to-return lag is at most this plus one health request
NO_PATTERN_HEALTH_SECONDS = 0.25  # health poll when the kind has no ready line to wait for
CRASH_SETTLE_SECONDS = 1.0  # after a traceback ends, let chained exceptions and other ranks' copies arrive
DYING_WAIT_SECONDS = 10.0  # after a crash is logged mid-session, how long a still-answering server may take to die
USAGE_EXIT_WAIT_SECONDS = 15.0  # a usage error is followed by exit 2, but torch-heavy imports exit slowly
STATUS_EVERY_SECONDS = 30.0
FAILURE_GRACE_SECONDS = 0.5  # a server that failed to start gets little politeness: the error must not wait
SIM_ENV = "PYTEST_SGLANG_SIM"

StatusCallback = Callable[[str], None]


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server, resolved from a profile and the command line."""

    profile: Profile
    kind: Kind
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    log_path: Path
    startup_timeout: float
    ready_pattern: str | None
    health_path: str | None

    @property
    def base_url(self) -> str:
        return _base_url(self.host, self.port)


def plan_launch(
    profile: Profile, *, sim: bool, log_dir: Path, startup_timeout: float | None = None
) -> LaunchPlan:
    """Turn a profile into a command line, an environment and the rules that say when it is ready."""
    kind = SGLANG if sim else KINDS[profile.kind]
    host = profile.host
    port = profile.port or free_port(host)
    values = {
        "python": profile.python or sys.executable,
        "model": profile.model or "",
        "host": host,
        "port": str(port),
    }
    if sim:
        template: tuple[str, ...] = (sys.executable, "-m", "pytest_sglang.sim", *SGLANG.command[3:], *profile.args)
    elif profile.command:
        template = profile.command
    else:
        template = (*kind.command, *profile.args)
        if profile.model is None:
            template = _drop_flag(template, kind.model_flag)
        else:
            _check_model_path(profile)
    argv = [_substitute(part, values) for part in template]
    env = {**os.environ, **profile.env}
    if sim:
        env[SIM_ENV] = json.dumps(dict(profile.sim))
    return LaunchPlan(
        profile=profile,
        kind=kind,
        argv=argv,
        env=env,
        host=host,
        port=port,
        log_path=log_dir / f"{profile.name}.log",
        startup_timeout=startup_timeout or profile.startup_timeout,
        ready_pattern=profile.ready_pattern if profile.ready_pattern is not None else kind.ready_pattern,
        health_path=profile.health_path if profile.health_path is not None else kind.health_path,
    )


@dataclass(eq=False)
class SGLangServer:
    """The `sglang_server` fixture's value: a ready server and what its startup looked like."""

    profile: str
    kind: str
    host: str
    port: int
    startup_seconds: float  # launch to ready; 0.0 for a server attached with --sglang-url
    phases: dict[str, float]  # phase -> seconds since launch when it began; "ready" is the last
    log_path: Path | None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    config: Profile | None = field(default=None, repr=False)
    health_path: str | None = "/health"
    reused: bool = False  # attached to a server kept from an earlier run by --sglang-reuse
    reused_pid: int | None = field(default=None, repr=False)
    _process: ServerProcess | None = field(default=None, repr=False)
    _tail: LogTail | None = field(default=None, repr=False)
    _watcher: LogWatcher | None = field(default=None, repr=False)
    _death: ServerDiedError | None = field(default=None, repr=False)
    _survived_failure: float | None = field(default=None, repr=False)  # a crash logged while it kept serving

    @property
    def base_url(self) -> str:
        return _base_url(self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else self.reused_pid

    def url(self, path: str = "/") -> str:
        return self.base_url + "/" + path.lstrip("/")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise ServerDiedError (with the log's root cause) if the server has died; `wait` lets a dying
        server finish dying, so a failed request is reported as the crash that caused it.

        A server that has logged a crash since it was ready gets up to DYING_WAIT_SECONDS to exit or stop
        answering (vLLM's API server answers 500 for a moment after its engine died); if it is still healthy
        then, that crash is taken as survived and costs no further wait."""
        if self._death is not None:
            raise self._death
        if self.has_logged_crash():
            wait = max(wait, DYING_WAIT_SECONDS)
        deadline = time.monotonic() + wait
        while True:
            self._death = self._find_death()
            if self._death is not None:
                raise self._death
            if time.monotonic() >= deadline:
                if self._watcher is not None:
                    self._survived_failure = self._watcher.failing_since
                return
            time.sleep(0.1)

    def has_logged_crash(self) -> bool:
        """Whether the log shows a crash since ready that the server has not (yet) been seen to survive."""
        if self._watcher is None or self._tail is None:
            return False
        self._watcher.feed(self._tail.read_lines(), time.monotonic())
        failing = self._watcher.failing_since
        return failing is not None and failing != self._survived_failure

    def _find_death(self) -> ServerDiedError | None:
        if self._process is None or self._tail is None or self._watcher is None:
            if self.reused_pid is not None:  # its pid says as much as /health, which costs SGLang ~1 s a call
                if psutil.pid_exists(self.reused_pid):
                    return None
                return ServerDiedError(
                    f"reused server (pid {self.reused_pid}) is gone", profile=self.profile,
                    log_path=self.log_path, diagnosis=Diagnosis(),
                    hints=["run again: --sglang-reuse launches a fresh server when the kept one is gone"],
                )
            if self.health_path and not health_ok(self.url(self.health_path), self.headers, timeout=5.0):
                return ServerDiedError(
                    f"server at {self.base_url} no longer answers {self.health_path}",
                    profile=self.profile, log_path=self.log_path, diagnosis=Diagnosis(),
                )
            return None
        now = time.monotonic()
        self._watcher.feed(self._tail.read_lines(), now)
        code = self._process.poll()
        if code is not None:
            self._watcher.feed(self._tail.flush(), now)
            return self._died("server died during the session", code)
        if self.has_logged_crash() and not self._healthy():
            error = self._died("server died during the session: it logged a crash and stopped answering", None)
            self._process.stop(grace=FAILURE_GRACE_SECONDS)
            return error
        return None

    def _died(self, headline: str, code: int | None) -> ServerDiedError:
        assert self._process is not None and self._watcher is not None
        return ServerDiedError(
            headline,
            profile=self.profile,
            log_path=self.log_path,
            diagnosis=self._watcher.diagnosis(exit_code=code),
            elapsed=time.monotonic() - self._process.started_at,
            hints=["every later test that uses this server fails with this same error; fix the crash above"],
        )

    def _healthy(self) -> bool:
        return not self.health_path or health_ok(self.url(self.health_path), self.headers, timeout=2.0)

    def stop(self, grace: float = 30.0) -> None:
        """Tear down the whole process tree and wait until the port is free. No-op for attached servers."""
        if self._process is None:
            return
        self._process.stop(grace=grace)
        wait_port_free(self.host, self.port)


def start_server(plan: LaunchPlan, *, on_status: StatusCallback | None = None, reap: bool = True) -> SGLangServer:
    """Launch the planned server and return once it is ready; on any failure nothing is left running."""
    profile = plan.profile
    register_secret(profile.api_key)
    register_env_secrets(profile.env)
    register_env_secrets(os.environ)
    check_port_free(plan.host, plan.port, plan.health_path)
    process = ServerProcess(plan.argv, env=plan.env, log_path=plan.log_path, reap_on_parent_death=reap)
    tail = LogTail(plan.log_path)
    watcher = LogWatcher(plan.kind, ready_pattern=plan.ready_pattern, started_at=process.started_at)
    try:
        startup_seconds = wait_until_ready(plan, process, tail, watcher, on_status or (lambda _: None))
    except BaseException:  # KeyboardInterrupt during a 10-minute startup included
        process.stop(grace=min(FAILURE_GRACE_SECONDS, profile.shutdown_grace))
        raise
    phases = dict(watcher.phases)
    phases["ready"] = startup_seconds
    return SGLangServer(
        profile=profile.name,
        kind=plan.kind.name,
        host=plan.host,
        port=plan.port,
        startup_seconds=startup_seconds,
        phases=phases,
        log_path=plan.log_path,
        model=profile.model,
        api_key=profile.api_key,
        config=profile,
        health_path=plan.health_path,
        _process=process,
        _tail=tail,
        _watcher=watcher,
    )


def wait_until_ready(
    plan: LaunchPlan, process: ServerProcess, tail: LogTail, watcher: LogWatcher, on_status: StatusCallback
) -> float:
    """Watch the log and the process until the server is ready; return seconds from launch to ready.

    Ready means: the kind's ready line was logged (if it has one) and then its health path answers 200
    (if it has one). Failure means: the process exited, a traceback or fatal marker appeared while it is
    still alive and no readiness followed within CRASH_SETTLE_SECONDS, or the startup timeout passed.
    """
    started = process.started_at
    headers = {"Authorization": f"Bearer {plan.profile.api_key}"} if plan.profile.api_key else {}
    health_url = plan.base_url + plan.health_path if plan.health_path else None
    session = requests.Session()
    last_health = 0.0
    last_status, last_label = started, None

    def fail(headline: str, code: int | None, hints: list[str]) -> ServerStartupError:
        return ServerStartupError(
            headline,
            profile=plan.profile.name,
            log_path=plan.log_path,
            diagnosis=watcher.diagnosis(exit_code=code),
            elapsed=time.monotonic() - started,
            hints=hints,
            command=plan.argv,
        )

    while True:
        now = time.monotonic()
        watcher.feed(tail.read_lines(), now)
        code = process.poll()
        if code is not None:
            watcher.feed(tail.read_lines() + tail.flush(), time.monotonic())
            raise fail("server exited during startup", code, _exit_hints(code))
        if watcher.failing_since is not None and now - watcher.failing_since >= _settle_seconds(watcher):
            raise fail(
                "server crashed during startup (its process was still alive; the tree has been killed)",
                None, [],
            )
        log_ready = plan.ready_pattern is None or watcher.ready_at is not None
        if log_ready and watcher.failing_since is None:
            if health_url is None:
                return (watcher.ready_at or now) - started
            if plan.ready_pattern is not None or now - last_health >= NO_PATTERN_HEALTH_SECONDS:
                last_health = now
                if health_ok(health_url, headers, timeout=2.0, session=session):
                    return time.monotonic() - started
        if now - started > plan.startup_timeout:
            raise fail(
                f"server was not ready within its startup timeout of {plan.startup_timeout:.0f} s",
                None,
                [
                    "raise startup_timeout in the profile or pass --sglang-startup-timeout=SECONDS",
                    "look at the last phase and log lines above: a hang there (NCCL init, a download) "
                    "will not end by waiting longer",
                ],
            )
        label = watcher.phase_label
        if label != last_label or now - last_status >= STATUS_EVERY_SECONDS:
            on_status(f"[sglang {plan.profile.name}] {now - started:.0f} s  {watcher.status(now)}")
            last_status, last_label = now, label
        time.sleep(POLL_SECONDS)


def _settle_seconds(watcher: LogWatcher) -> float:
    """How long a logged failure may take to play out before the still-running process is called crashed.

    A usage error (argparse's `prog: error: ...`, click's `Error: ...`) always ends in exit code 2, but a
    process with torch loaded can take seconds to exit: wait for that exit, so the error says "exit code 2"."""
    if watcher.failure_is_usage_error:
        return USAGE_EXIT_WAIT_SECONDS
    return CRASH_SETTLE_SECONDS


def attach_server(url: str, *, profile: str, health_path: str | None = "/health", api_key: str | None = None,
                  timeout: float = 10.0) -> SGLangServer:
    """A handle on a server that is already running (--sglang-url): nothing is launched or killed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProfileError(f"--sglang-url={url!r} is not an http(s) URL such as http://127.0.0.1:30000.")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    check_url = url.rstrip("/") + (health_path or "/")
    deadline = time.monotonic() + timeout
    while not health_ok(check_url, headers, timeout=2.0):
        if time.monotonic() > deadline:
            raise ServerStartupError(
                f"--sglang-url server does not answer GET {health_path} with 200 at {url}",
                profile=profile, log_path=None, diagnosis=Diagnosis(), elapsed=timeout,
                hints=["start the server first, or drop --sglang-url to let the plugin launch it"],
            )
        time.sleep(0.25)
    return SGLangServer(
        profile=profile, kind="attached", host=parts.hostname, port=port, startup_seconds=0.0, phases={},
        log_path=None, api_key=api_key, health_path=health_path,
    )


def health_ok(url: str, headers: dict[str, str], *, timeout: float,
               session: requests.Session | None = None) -> bool:
    try:
        return (session or requests).get(url, headers=headers, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def _exit_hints(code: int) -> list[str]:
    if code == 2:
        return ["exit code 2 is the server's command-line parser rejecting a flag: check the profile's `args`"]
    if code in (-9, 137):
        return ["SIGKILL: SGLang kills its own tree after a child fails (see the root cause), "
                "or the OS OOM killer did (`dmesg -T | grep -i oom`)"]
    return []


def _substitute(part: str, values: dict[str, str]) -> str:
    """Fill {python} {model} {host} {port}; any other brace (a JSON flag value) is left as written."""
    for name, value in values.items():
        part = part.replace("{" + name + "}", value)
    return part


def _drop_flag(template: tuple[str, ...], flag: str | None) -> tuple[str, ...]:
    out, skip = [], False
    for part in template:
        if skip:
            skip = False
            continue
        if part == flag:
            skip = True
            continue
        out.append(part)
    return tuple(out)


def _check_model_path(profile: Profile) -> None:
    model = profile.model or ""
    looks_local = model.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(model).expanduser().exists():
        raise ProfileError(
            f"{profile.source}: profile {profile.name!r}, key 'model': model path {model} does not exist. "
            f"Check the path (and any ${{VAR}} in it); a hub name such as org/model is passed through as is."
        )


def _base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
