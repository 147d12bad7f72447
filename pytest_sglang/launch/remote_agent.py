"""The agent that pytest-sglang runs on an ssh host: it owns the remote server's tree there.

Not imported on the host: launch/remote.py sends this file's source over ssh's stdin and the host's python runs
it (``python -c BOOTSTRAP pytest-sglang MODE``), so the host needs no pytest-sglang, only a Python 3.7+ and
its standard library. The first stdin line is this source (as a JSON string), the second the mode's spec
(JSON). Nothing here passes through a shell: the server's argv and environment arrive as JSON. Hence one file,
whatever its length: what the host runs is exactly this source, and it can import nothing of the plugin's.

Modes:
    supervise  start the server in its own session (setsid) with its log in a file and an owner token in its
               environment; print events as JSON lines ("started", "error", "exit", "swept"); tear the tree down
               (SIGTERM the group, grace, SIGKILL, sweep by owner token) on "stop GRACE", on end-of-file
               (the controller or its connection is gone), on a missed heartbeat (a silent dead connection),
               or on SIGTERM/SIGHUP/SIGINT. Leftovers of a server that exited by itself are swept the same way.
    stream     copy the log to stdout from byte 0, following it (and its replacement or truncation), until
               the supervisor is gone or stdin ends, and the log is drained.
    sweep      kill every process carrying an owner token (the controller's last net, over a new connection).
    machine    the host's GPUs (nvidia-smi, with the profile's environment) and CPU, for the baseline key.
    gpus       the host's GPU readings for the telemetry (NVML where its python imports pynvml, else nvidia-smi
               with the profile's environment). Protocol GPU_PROTOCOL: first a "gpus" event (the source or why
               there is none, the GPUs the server's tree holds, its CUDA_VISIBLE_DEVICES, the agent's clock);
               then JSON commands on stdin, one a line: {"do": "ping"} -> "pong" (the clock), {"do": "read",
               "gpus": [..] | null} -> one "reading", {"do": "start", "gpus", "interval"} -> a "reading" every
               interval until {"do": "stop"} -> one last "reading" and "stopped". A reading's rows are [index,
               util %, memory MiB, power W, SM clock MHz, temperature C, energy mJ] (protocol 2 added the
               last: NVML's energy counter, null where the GPU has none and always under nvidia-smi). Clocks
               and reading times are time.monotonic() here; the controller maps them onto its own. Ends on
               end-of-file or once the supervisor is gone.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NoReturn

OWNER_ENV = "PYTEST_SGLANG_OWNER"  # the same name as launch/process.py's (this file cannot import it there)
EOF_GRACE = 5.0  # the controller is gone: the grace the local reaper gives too
EXITED_GRACE = 1.0  # the server exited by itself: what it left behind gets little politeness
POLL = 0.1


def emit(event: str, **facts: Any) -> None:
    """One event line for the controller; a controller that is gone makes this a no-op."""
    try:
        sys.stdout.write(json.dumps({"event": event, **facts}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def owned(token: str) -> list[int]:
    """Pids of live processes whose environment carries the owner token (Linux /proc; [] elsewhere)."""
    needle = f"{OWNER_ENV}={token}".encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0") and not _zombie(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _signal(pids: list[int], group: int | None, sig: int) -> None:
    if group is not None:
        try:
            os.killpg(group, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_tree(group: int | None, token: str, grace: float, server: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the server first (it stops its own children in order: see process.kill_tree), then, once it
    has gone or half the grace is spent, the group and every token holder; wait up to `grace`, then SIGKILL,
    and sweep again."""
    deadline = time.monotonic() + grace
    if server is not None and server.poll() is None:
        server.terminate()
        while server.poll() is None and time.monotonic() < deadline - grace / 2:
            time.sleep(POLL)
    _signal(owned(token), group, signal.SIGTERM)
    while time.monotonic() < deadline:
        if server is not None:
            server.poll()
        if not owned(token) and (server is None or server.returncode is not None):
            break
        time.sleep(POLL)
    for _ in range(3):  # a descendant may have spawned more during the grace: look again
        _signal(owned(token), group, signal.SIGKILL)
        if server is not None:
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        time.sleep(POLL)
        if not owned(token):
            return


def _lines(stream: Any, out: queue.Queue[bytes | None]) -> None:
    for line in iter(stream.readline, b""):
        out.put(line)
    out.put(None)


def _launch(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str] | int:
    """The server started in its own session, its log in a file: it and the log's path, or the exit code
    after an "error" event (its port taken here, no log, no executable)."""
    log_dir = os.path.expanduser(spec.get("log_dir") or os.path.join(tempfile.gettempdir(),
                                                                     f"pytest-sglang-{os.getuid()}", "remote"))
    log_path = os.path.join(log_dir, spec["log_name"])
    host, port = str(spec.get("check_host") or "127.0.0.1"), spec.get("check_port")
    if port:  # refuse a taken port here, where the server would bind it (as a server does: SO_REUSEADDR)
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, int(port)))
        except OSError as exc:
            emit("error", kind="port", message=f"port {port} on {host} is taken there ({exc.strerror})")
            return 3
    try:
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
        log = open(log_path, "wb")  # noqa: SIM115 - the server holds it; closed below
    except OSError as exc:
        emit("error", kind="log", message=f"cannot write the log {log_path}: {exc.strerror}")
        return 3
    env = {**os.environ, **spec["env"], OWNER_ENV: spec["token"], "PYTHONUNBUFFERED": "1"}
    try:
        server = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        emit("error", kind="exec", message=f"cannot run {spec['argv'][0]}: {exc.strerror}", log=log_path)
        return 3
    finally:
        log.close()
    return server, log_path


def supervise(spec: dict[str, Any]) -> int:
    token, grace_eof = spec["token"], float(spec.get("eof_grace", EOF_GRACE))
    launched = _launch(spec)
    if isinstance(launched, int):
        return launched
    server, log_path = launched
    stop: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    emit("started", pid=server.pid, agent=os.getpid(), log=log_path)
    inbox: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_lines, args=(sys.stdin.buffer, inbox), daemon=True).start()
    heartbeat_timeout = float(spec.get("heartbeat_timeout") or 0) or None
    last_heard = time.monotonic()
    while True:
        try:
            line = inbox.get(timeout=POLL)
        except queue.Empty:
            line = b""
        else:
            last_heard = time.monotonic()
        reason, grace = None, grace_eof
        if line is None:
            reason = "the controller's connection ended"
        elif line.startswith(b"stop"):
            reason, grace = "stopped by the controller", float(line.split()[1])
        elif stop:
            reason = f"the agent got {stop[0]}"
        elif heartbeat_timeout and time.monotonic() - last_heard > heartbeat_timeout:
            reason = f"no heartbeat from the controller for {heartbeat_timeout:g} s"
        elif server.poll() is not None:
            reason, grace = "the server exited", EXITED_GRACE
        if reason is not None:
            if server.poll() is not None:  # said at once: the exit code is the news, the sweep comes after
                emit("exit", code=server.returncode, reason=reason, size=_size(log_path))
                kill_tree(server.pid, token, grace, server)
            else:
                kill_tree(server.pid, token, grace, server)
                emit("exit", code=server.returncode, reason=reason, size=_size(log_path))
            emit("swept", left=len(owned(token)))
            return 0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return not _zombie(pid)


def stream(spec: dict[str, Any]) -> int:
    path, supervisor = spec["log"], int(spec["supervisor"])
    out = sys.stdout.buffer
    fh, identity, pos = None, None, 0
    while True:
        readable, _, _ = select.select([0], [], [], POLL)
        ended = bool(readable) and not os.read(0, 4096)  # the controller is done, or gone
        done = ended or not _alive(supervisor)  # read once more after this: what it wrote last is there now
        try:
            st = os.stat(path)
            if fh is None or (st.st_dev, st.st_ino) != identity or st.st_size < pos:
                if fh is not None:
                    fh.close()
                fh, identity, pos = open(path, "rb"), (st.st_dev, st.st_ino), 0  # noqa: SIM115
        except OSError:
            pass  # not there (yet, or while it is replaced)
        while fh is not None:
            data = fh.read(1 << 20)
            if not data:
                break
            pos += len(data)
            try:
                out.write(data)
                out.flush()
            except OSError:
                return 0
        if done:
            return 0


def sweep(spec: dict[str, Any]) -> int:
    kill_tree(None, spec["token"], float(spec.get("grace", 0.0)))
    emit("swept", left=len(owned(spec["token"])))
    return 0


def machine(spec: dict[str, Any]) -> int:
    env = {**os.environ, **spec.get("env", {})}
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    gpus = ""
    if exe:
        try:
            gpus = subprocess.run([exe, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                                  env=env, capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            gpus = ""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.lower().startswith("model name")), "")
    except OSError:
        pass
    emit("machine", gpus=gpus, visible=env.get("CUDA_VISIBLE_DEVICES"), cpu=cpu or os.uname().machine,
         cores=os.cpu_count() or 1)
    return 0


GPU_PROTOCOL = 2  # 2: each row ends with the energy counter (mJ or null)
SMI_QUERY = "--query-gpu=index,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu"
SMI_TIMEOUT = 10.0


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):  # nvidia-smi's "[N/A]", a field NVML does not support
        return None


class _Smi:
    """nvidia-smi, one call per reading."""

    name = "nvidia-smi"

    def __init__(self, exe: str, env: dict[str, str]) -> None:
        self.exe, self.env = exe, env

    def _rows(self, *args: str) -> list[list[str]] | None:
        try:
            done = subprocess.run([self.exe, *args, "--format=csv,noheader,nounits"], env=self.env,
                                  capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line.strip()]

    def read(self, gpus: list[int] | None) -> list[list[Any]] | None:
        rows = self._rows(SMI_QUERY, *(["--id=" + ",".join(map(str, gpus))] if gpus is not None else []))
        if rows is None:
            return None
        return [[int(row[0]), *map(_number, row[1:]), None] for row in rows if len(row) == 6 and row[0].isdigit()]

    def held(self, pids: set[int]) -> list[int]:
        index = {row[1]: int(row[0]) for row in self._rows("--query-gpu=index,pci.bus_id") or []
                 if len(row) == 2 and row[0].isdigit()}
        apps = self._rows("--query-compute-apps=pid,used_memory,gpu_bus_id") or []
        return sorted({index[row[2]] for row in apps if len(row) > 2 and row[0].isdigit() and int(row[0]) in pids
                       and row[2] in index})

    def close(self) -> None:
        pass


class _Nvml:
    """NVML, one session for every reading."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _ask(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:  # NVMLError_NotSupported on one field: that field is None
            return None

    def read(self, gpus: list[int] | None) -> list[list[Any]] | None:
        nvml = self.nvml
        energy = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)  # absent in an old nvidia-ml-py
        try:
            found = []
            for index in range(nvml.nvmlDeviceGetCount()) if gpus is None else gpus:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = self._ask(nvml.nvmlDeviceGetUtilizationRates, handle)
                memory = self._ask(nvml.nvmlDeviceGetMemoryInfo, handle)
                power = self._ask(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
                found.append([index, _number(getattr(util, "gpu", None)),
                              memory.used / (1024 * 1024) if memory is not None else None,
                              power / 1000.0 if power is not None else None,
                              _number(self._ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)),
                              _number(self._ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)),
                              _number(self._ask(energy, handle)) if energy is not None else None])
            return found
        except Exception:  # a GPU that fell off the bus mid-query: no answer rather than a wrong one
            return None

    def held(self, pids: set[int]) -> list[int]:
        nvml, found = self.nvml, set()
        for index in range(self._ask(nvml.nvmlDeviceGetCount) or 0):
            handle = self._ask(nvml.nvmlDeviceGetHandleByIndex, index)
            if any(int(p.pid) in pids for p in self._ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []):
                found.add(index)
        return sorted(found)

    def close(self) -> None:
        self._ask(self.nvml.nvmlShutdown)


def _gpu_reader(choice: str | None, env: dict[str, str]) -> tuple[Any, str]:
    """The host's GPU source for ``choice`` (PYTEST_SGLANG_GPU_QUERY's values; None: NVML, else nvidia-smi), or
    None and why there is none."""
    if choice == "off":
        return None, "PYTEST_SGLANG_GPU_QUERY=off"
    nvml_said = "not tried (PYTEST_SGLANG_GPU_QUERY=nvidia-smi)"
    if choice in (None, "nvml"):
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]

            pynvml.nvmlInit()
            return _Nvml(pynvml), ""
        except ImportError:
            nvml_said = f"{sys.executable} there cannot import pynvml (nvidia-ml-py)"
        except Exception as exc:  # NVMLError: no driver, no GPU
            nvml_said = f"NVML did not start ({exc})"
        if choice == "nvml":
            return None, f"no NVML: {nvml_said}"
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is not None:
        return _Smi(exe, env), ""
    return None, f"no NVML ({nvml_said}) and no nvidia-smi on its PATH ({env.get('PATH', '')})"


class _Readings:
    """A thread reading the GPUs every interval until stopped; each reading one "reading" event."""

    def __init__(self, reader: Any, gpus: list[int] | None, interval: float, say: Any) -> None:
        self.reader, self.gpus, self.interval, self.say = reader, gpus, interval, say
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.say("reading", readings=self.reader.read(self.gpus), t=time.monotonic())
            if self.halt.wait(self.interval):
                self.say("reading", readings=self.reader.read(self.gpus), t=time.monotonic())
                return

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(SMI_TIMEOUT + 1)


def _obey(line: bytes, reader: Any, sampling: _Readings | None, say: Any) -> _Readings | None:
    """Do one command of the controller's; the readings thread running after it."""
    try:
        command = json.loads(line)
    except ValueError:
        return sampling
    do = command.get("do") if isinstance(command, dict) else None
    if do == "ping":
        say("pong", clock=time.monotonic())
    elif do == "read":
        say("reading", readings=reader.read(command.get("gpus")), t=time.monotonic())
    elif do == "start" and sampling is None:
        return _Readings(reader, command.get("gpus"), float(command.get("interval") or 0.1), say)
    elif do == "stop":
        if sampling is not None:
            sampling.stop()
        say("stopped")
        return None
    return sampling


def gpus(spec: dict[str, Any]) -> int:
    env = {**os.environ, **spec.get("env", {})}
    lock = threading.Lock()

    def say(event: str, **facts: Any) -> None:
        with lock:
            emit(event, **facts)

    reader, why = _gpu_reader(spec.get("query") or env.get("PYTEST_SGLANG_GPU_QUERY"), env)
    if reader is None:
        say("gpus", protocol=GPU_PROTOCOL, source=None, why=why, clock=time.monotonic())
        return 0
    held = reader.held({int(spec["pid"]), *owned(spec["token"])})
    say("gpus", protocol=GPU_PROTOCOL, source=reader.name, held=held, visible=env.get("CUDA_VISIBLE_DEVICES"),
        clock=time.monotonic())
    supervisor, sampling, pending = int(spec.get("supervisor") or 0), None, b""
    try:
        while True:  # stdin by select, so that the supervisor's end is seen between commands too
            readable, _, _ = select.select([0], [], [], POLL)
            if not readable:
                if supervisor and not _alive(supervisor):
                    return 0
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return 0
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                sampling = _obey(line, reader, sampling, say)
    finally:
        if sampling is not None:
            sampling.stop()
        reader.close()


MODES = {"supervise": supervise, "stream": stream, "sweep": sweep, "machine": machine, "gpus": gpus}


def main(argv: list[str]) -> NoReturn:
    spec = json.loads(sys.stdin.buffer.readline())
    code = MODES[argv[-1]](spec)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    # not the interpreter's exit: its finalization aborts (SIGABRT, "could not acquire lock for <stdin>") while
    # a daemon thread is blocked reading stdin, as supervise's is
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
