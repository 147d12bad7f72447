"""A real OpenSSH server on loopback for the remote (ssh) tests, with keys made at test time.

The session fixture ``sshd`` starts ``/usr/sbin/sshd -D -f CONFIG`` on a free port of 127.0.0.1 (Debian's
openssh-server; .ci/run installs it) with a host key and an authorized client key from ssh-keygen, and writes
a client config with three Host aliases: ``sshd-test`` (the right key, the host key known), ``sshd-unknown-host``
(the right key, an empty known_hosts) and ``sshd-wrong-key`` (a key the server does not accept). Profiles point
at it with ``ssh_options = ["-F", CONFIG]``, so the user's ~/.ssh is never read. Where sshd is missing or
cannot start, every test here is skipped with the reason.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import die_with_pytest

SSHD = "/usr/sbin/sshd"
ALIASES = ("sshd-test", "sshd-unknown-host", "sshd-wrong-key")


@dataclass(frozen=True)
class Sshd:
    port: int
    folder: Path
    client_config: Path

    def profile_keys(self, alias: str = "sshd-test", python: str = sys.executable) -> str:
        """TOML lines that send a profile to this sshd, run by ``python`` there (this venv's, by default)."""
        return f'ssh = "{alias}"\nssh_options = ["-F", "{self.client_config}"]\npython = "{python}"\n'

    def ssh(self, *command: str, alias: str = "sshd-test", timeout: float = 15) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ssh", "-F", str(self.client_config), alias, *command], capture_output=True,
                              text=True, timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True,
                   capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip(f"no OpenSSH server at {SSHD} (or no ssh/ssh-keygen): `apt-get install -y openssh-server` "
                    "(.ci/run does) to run the remote tests")
    folder = tmp_path_factory.mktemp("sshd")
    host_key = _keygen(folder / "host_key")
    (folder / "authorized_keys").write_text(_keygen(folder / "client_key") + "\n")
    _keygen(folder / "wrong_key")
    port = _free_port()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key.split()[:2])}\n")
    (folder / "empty_known_hosts").write_text("")
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}", f"PidFile {folder / 'sshd.pid'}",
        "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "MaxStartups 200", "MaxSessions 100",
        "LogLevel VERBOSE", "",
    ]))
    client = folder / "ssh_config"
    client.write_text("\n".join([
        "Host sshd-test", f"    IdentityFile {folder / 'client_key'}",
        f"    UserKnownHostsFile {folder / 'known_hosts'}",
        "Host sshd-unknown-host", f"    IdentityFile {folder / 'client_key'}",
        f"    UserKnownHostsFile {folder / 'empty_known_hosts'}",
        "Host sshd-wrong-key", f"    IdentityFile {folder / 'wrong_key'}",
        f"    UserKnownHostsFile {folder / 'known_hosts'}",
        "Host *", "    HostName 127.0.0.1", f"    Port {port}", f"    User {getpass.getuser()}",
        "    IdentitiesOnly yes", "    IdentityAgent none", "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes", "    LogLevel ERROR", "",
    ]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege-separation folder
    log = open(folder / "sshd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=die_with_pytest())
    server = Sshd(port, folder, client)
    try:
        deadline = time.monotonic() + 10
        while True:
            said = server.ssh("true") if proc.poll() is None else None
            if said is not None and said.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                why = (folder / "sshd.log").read_text(errors="replace")[-800:] or (said.stderr if said else "")
                pytest.skip(f"sshd did not start or let the test key in: {why.strip()}")
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
