"""Typed errors. Each message says what happened, for how long, what the server said, and what to try."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

_SECRETS: set[str] = set()
SECRET_NAME = re.compile(r"TOKEN|API_KEY|SECRET|PASSWORD", re.IGNORECASE)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The only place the API key goes: an ``Authorization`` header, never a message or a repr."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def register_secret(value: str | None) -> None:
    """Remember a value that must never be shown (an --api-key, a *_TOKEN variable)."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def register_env_secrets(env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if SECRET_NAME.search(name) and "${" not in value:  # an unset ${VAR} is its own name, no secret
            register_secret(value)


def register_arg_secrets(argv: Sequence[str]) -> None:
    """Remember the values of secret-named flags: ``--api-key X``, ``--hf-token=X``, ``--admin-api-key X``."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--") or not SECRET_NAME.search(flag.replace("-", "_")):
            continue
        if eq:
            register_secret(value)
        elif i + 1 < len(argv):
            register_secret(argv[i + 1])


# Secrets the plugin was never told about but a server prints: SGLang's `server_args=ServerArgs(...,
# api_key='...')`, vLLM's `Namespace(..., hf_token='...')`, an `Authorization: Bearer ...` header.
_SECRET_FIELD = re.compile(r"\b(\w*(?:api_key|_token|secret|password)\b)=(['\"])([^'\"]+)\2", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]{4,}")


def redact(text: str) -> str:
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _SECRET_FIELD.sub(lambda m: f"{m.group(1)}={m.group(2)}***{m.group(2)}", text)
    return _BEARER.sub(r"\1***", text)


class PluginError(Exception):
    """Base of every error pytest-sglang raises on purpose. Its text is redacted wherever it is shown."""

    def __str__(self) -> str:
        return redact(super().__str__())


class ResourcesHeldWarning(UserWarning):
    """A stopped server's processes still hold GPU memory or its port after the release bound."""


class ProfileError(PluginError):
    """A profile is unknown, malformed, or names a bad key or value."""


class EnvKnobError(PluginError):
    """A PYTEST_SGLANG_* environment variable holds a value the plugin cannot use."""


class CpuAffinityError(ProfileError):
    """A profile's ``cpus`` cannot be applied on this machine (a CPU it does not have, or no affinity here)."""


class PortInUseError(PluginError):
    """Something already listens on the port the server was meant to take."""


class BenchmarkError(PluginError):
    """A benchmark could not run, or some of its requests failed."""


class BenchmarkFailedError(BenchmarkError):
    """Some benchmark requests failed; ``result`` holds the figures of the run anyway (or None)."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class ServerRequestError(BenchmarkError):
    """A request to the server was answered with an error status, or with a body that is not what the API
    promises; ``status`` is the HTTP status (None when there was no HTTP answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BaselineError(PluginError):
    """The baseline file cannot be read or written, or a check was asked for wrongly."""


class SeriesError(PluginError, ValueError):
    """A series handed to the change-point search, or its settings, cannot be searched: what was wrong."""


class ResultNotFoundError(PluginError, KeyError):
    """No benchmark result was recorded for that profile and test in this session."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class ProfileComparisonError(PluginError, AssertionError):
    """One profile did not beat another by the margin asked for."""


class ABStartupError(PluginError):
    """One server of an A/B pair could not start: which one, beside what, and what to change."""


class UsageProblem(PluginError):
    """An option, a combination of options or a selection that cannot work (pytest: a usage error, before any
    server launches): what to pass instead."""


class NotRunError(PluginError):
    """What a test or a comparison needs did not run in this session (a profile not selected, a server that did
    not start, a figure this run cannot have): not a failure of the thing tested (pytest: a skip)."""


class CheckFailedError(PluginError, AssertionError):
    """A check judged a regression, could not be made, or could not judge under --sglang-not-judged=fail: the
    message is the whole verdict (pytest: the test fails with it alone)."""


@dataclass
class Diagnosis:
    """What the log said about a failure: the facts an error message is built from."""

    root_causes: list[str] = field(default_factory=list)  # one block per distinct exception, cause line first
    last_lines: list[str] = field(default_factory=list)
    phase: str | None = None  # last startup phase reached
    exit_code: int | None = None  # negative: killed by that signal (Popen's convention)
    died_first: str | None = None  # which process of the server's tree died first, and how (launch/members.py)
    # the root causes are only the server's fatal-marker lines ("SIGQUIT received", "Initialization failed"):
    # its reaction to a failure it printed no exception for, so the process that died first says more
    reaction_only: bool = False


def describe_exit(code: int | None) -> str | None:
    if code is None:
        return None
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {128 - code})"
    return f"exit code {code}"


class ServerError(PluginError):
    """A server failed; the message is built from a Diagnosis. ``member``: the fleet member or node that failed,
    where the server has several (None: the server as a whole)."""

    member: str | None = None

    def __init__(
        self,
        headline: str,
        *,
        profile: str,
        log_path: Path | None,
        diagnosis: Diagnosis,
        elapsed: float | None = None,
        hints: Sequence[str] = (),
        command: Sequence[str] | None = None,
    ) -> None:
        self.headline = headline
        self.profile = profile
        self.log_path = log_path
        self.diagnosis = diagnosis
        self.elapsed = elapsed
        self.hints = list(hints)
        self.command = list(command) if command else None
        super().__init__(self.render())

    @property
    def cause(self) -> str | None:
        """The root cause in one line (the first exception line the log showed), or None."""
        causes = self.diagnosis.root_causes
        if not causes or not causes[0].strip() or (self.diagnosis.reaction_only and self.diagnosis.died_first):
            return redact(self.diagnosis.died_first) if self.diagnosis.died_first else None
        line = causes[0].strip().splitlines()[0]
        return redact(line if len(line) <= 240 else line[:239] + "\u2026")

    def render(self) -> str:
        d = self.diagnosis
        # The first line is what pytest's short summary shows: it carries the cause, before the facts.
        parts = [f"[sglang {self.profile}] {self.headline}" + (f": {self.cause}" if self.cause else "")]
        facts = []
        if self.elapsed is not None:
            facts.append(f"after {self.elapsed:.1f} s")
        exit_text = describe_exit(d.exit_code)
        if exit_text:
            facts.append(exit_text)
        if d.phase:
            facts.append(f"last phase: {d.phase}")
        if facts:
            parts[0] += " (" + ", ".join(facts) + ")"
        died_first_is_cause = d.died_first is not None and (not d.root_causes or d.reaction_only)
        if d.died_first and not died_first_is_cause:  # else it is the cause, on the first line
            parts.append(f"First process of the server's tree to die: {d.died_first}")
        if d.root_causes:
            parts.append("")
            parts.append("What the server logged of it:" if died_first_is_cause else "Root cause from the server log:")
            for block in d.root_causes:
                parts.extend("    " + line for line in block.splitlines())
                parts.append("")
        elif d.last_lines:
            parts.append("")
            parts.append(f"Last {len(d.last_lines)} log lines:")
            parts.extend("    " + line for line in d.last_lines)
            parts.append("")
        if self.log_path is not None:
            parts.append(f"Full log: {self.log_path}")
        if self.command:
            parts.append(f"Command: {' '.join(self.command)}")
        for hint in self.hints:
            parts.append(f"Try: {hint}")
        return redact("\n".join(parts))


class ServerStartupError(ServerError):
    """The server did not become ready: it exited, crashed while alive, or timed out."""


class ServerDiedError(ServerError):
    """A server that was ready has died during the session."""


class RemoteError(PluginError):
    """An ssh profile's host could not be used: ssh refused (key, host key, address), its python is missing,
    or the connection was lost. The message names the host and what to do."""


class SlurmError(PluginError):
    """A slurm profile could not get its nodes: no srun here, the allocation refused or pending too long, or
    the nodes' addresses unreadable. The message says what SLURM said and what to do."""


class _NamesRemoteLog(ServerError):
    """A server failure on an ssh host: the local copy of the log is the "Full log", the host's own is named."""

    def __init__(self, headline: str, *, remote_log: str, **facts: Any) -> None:
        self.remote_log = remote_log  # "user@host:/tmp/pytest-sglang-0/p-....log"
        super().__init__(headline, **facts)

    def render(self) -> str:
        text = super().render()
        if not self.remote_log:
            return text
        line = f"Full log: {self.log_path}"
        return text.replace(line, f"{line} (streamed from {self.remote_log})", 1) if line in text else (
            f"{text}\nRemote log: {self.remote_log}")

    @classmethod
    def naming(cls: type[_Named], error: ServerError, remote_log: str) -> _Named:
        """``error`` again, naming the remote log."""
        return cls(error.headline, remote_log=remote_log, profile=error.profile, log_path=error.log_path,
                   diagnosis=error.diagnosis, elapsed=error.elapsed, hints=error.hints, command=error.command)


_Named = TypeVar("_Named", bound=_NamesRemoteLog)


class RemoteStartupError(_NamesRemoteLog, ServerStartupError):
    """A server on an ssh host did not become ready (or its connection was lost during the startup)."""


class RemoteDiedError(_NamesRemoteLog, ServerDiedError):
    """A server on an ssh host died, or its connection was lost, during the session."""


class HistoryError(PluginError):
    """The run history (--sglang-history) cannot be used: it cannot be opened, is locked past the timeout, is
    not a history store, is read-only, or is of a newer format. The message says which and what to do; the
    file is left as it is."""
