"""What OpenSSH's stderr (and the remote shell's exit code) mean, in one sentence and one thing to try.

ssh exits 255 for its own failures and prints one line that says which; the remote shell exits 127 when it
cannot find the command (the profile's python). Each refusal gets its own message: a host key that is not
known, a host key that changed, a key the host refused, a host that cannot be reached or resolved, a local
port that cannot be forwarded, and a python the host does not have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# (pattern over ssh's stderr, what happened, what to try); {host} and {python} are filled in. First match wins.
RULES: tuple[tuple[str, str, str], ...] = (
    (r"REMOTE HOST IDENTIFICATION HAS CHANGED",
     "the host key of {host} has CHANGED since it was recorded in known_hosts (a reinstalled host, or someone "
     "in between)",
     "check with the host's owner why its key changed; if it is legitimate, remove the old key "
     "(`ssh-keygen -R HOST`) and connect once by hand (`ssh {host} true`) to accept the new one"),
    (r"Host key verification failed|host key is known for|No \S+ host key is known",
     "the host key of {host} is not known (not in known_hosts), and ssh runs in batch mode here, so it "
     "cannot ask whether to trust it",
     "connect once by hand (`ssh {host} true`), check the fingerprint and accept it; on a network you trust, "
     "`ssh-keyscan HOST >> ~/.ssh/known_hosts` adds it"),
    (r"Permission denied \(|Too many authentication failures|no mutual signature",
     "{host} refused the key (no password prompt is possible: ssh runs in batch mode here)",
     "check that `ssh {host} true` logs in without a prompt: load the key into your agent (`ssh-add KEY`), or "
     "name it with IdentityFile in ~/.ssh/config or in the profile: ssh_options = [\"-i\", \"KEY\"]"),
    (r"Could not resolve hostname",
     "the name {host} does not resolve",
     "check the profile's `ssh` (user@host, or a Host alias of ~/.ssh/config)"),
    (r"Connection refused|Connection timed out|No route to host|Network is unreachable|Operation timed out"
     r"|Connection closed by|Connection reset by",
     "cannot reach {host}",
     "check that `ssh {host} true` works from this machine (address, port, VPN, jump host in ~/.ssh/config)"),
    (r"cannot listen to port|Could not request local forwarding",
     "ssh could not open the local end of the port forward to the server",
     "run again (the local port was taken in between), or give the server a non-loopback `host` to reach "
     "it directly"),
)
MISSING_COMMAND = re.compile(r"(command )?not found|No such file or directory")
# What the agent refuses before it starts the server (its "error" event's kind) -> what to try.
AGENT_HINTS = {
    "port": "leave `port` out of the profile (a free one is chosen), or stop what holds that port on {host}",
    "log": "set the profile's `remote_log_dir` to a folder this user can write on {host}",
    "exec": "the first word of the server's command must exist on {host}: check the profile's `python` or `command`",
}


def explain(host: str, python: str, said: tuple[str, str] | None, code: int | None,
            ssh_lines: Sequence[str]) -> tuple[str, str]:
    """(what happened, what to try) for an ssh launch that failed before the server started. ``said``: the
    agent's own refusal (kind, message), where it ran; ``code``: ssh's exit code (None: no answer in time)."""
    if said is not None:
        kind, message = said
        return message, AGENT_HINTS.get(kind, "fix the profile for that host").format(host=host)
    text = "\n".join(ssh_lines)
    if code == 127 or (code not in (None, 255) and MISSING_COMMAND.search(text) and python in text):
        return (f"the remote python {python} was not found on {host} (the remote shell exited with code "
                f"{code})", f"set the profile's `python` to an interpreter on {host} (default: python3 on its "
                "PATH); the server runs with it there")
    if code == 255 or code is None:
        for pattern, what, hint in RULES:
            if re.search(pattern, text):
                return what.format(host=host, python=python), hint.format(host=host, python=python)
    if code is None:  # still running when the handshake time was up
        return (f"no answer from {host} in time: ssh did not connect, or the agent did not start the server",
                f"check that `ssh {host} {python} -V` answers within seconds from this machine")
    if code == 255:
        return f"ssh to {host} failed (exit code 255)", f"check that `ssh {host} true` works from this machine"
    return (f"the pytest-sglang agent on {host} exited with code {code} before it started the server (is {python} "
            "a Python 3.7 or newer?)", f"run `ssh {host} {python} -V` to check the remote python")
