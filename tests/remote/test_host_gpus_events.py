"""HostGpus's event reader against a scripted agent (a real process on pipes, no ssh): what a malformed line
or a reply that came too late must not do to a round."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from pytest_sglang.launch.remote_gpus import HostGpus

AGENT = r"""
import json, sys, time
for line in sys.stdin:
    do = json.loads(line)["do"]
    if do == "start":
        print(json.dumps({"event": "reading", "t": "not a time", "readings": [[0, 1, 2, 3, 4, 5]]}))
        print(json.dumps({"event": "reading", "t": 1.0, "readings": [[0, 50, 1000, 100, 1980, 40]]}), flush=True)
    elif do == "stop":
        time.sleep(0.3)
        print(json.dumps({"event": "reading", "t": 2.0, "readings": [[0, 60, 1000, 120, 1980, 41]]}))
        print(json.dumps({"event": "stopped"}), flush=True)
"""


def scripted_host(tmp_path: Path) -> HostGpus:
    proc = subprocess.Popen([sys.executable, "-c", AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stderr = open(tmp_path / "ssh.log", "wb")  # noqa: SIM115 - HostGpus.close closes it
    gpus = HostGpus(host="scripted", source="nvidia-smi", gpus=[0], gpus_from="test", offset=100.0,
                    clock_error_s=0.0, interval=0.1, ssh_log=tmp_path / "ssh.log", _proc=proc, _stderr=stderr)
    threading.Thread(target=gpus._read_events, daemon=True).start()
    return gpus


def test_a_malformed_reading_is_skipped_and_a_stale_stopped_does_not_end_the_next_round(tmp_path: Path) -> None:
    with scripted_host(tmp_path) as gpus:
        gpus._replies.put({"event": "stopped"})  # the last round's, come after its stop() gave up waiting
        gpus.start()
        samples = gpus.stop()
    assert [t for t, _ in samples] == [101.0, 102.0]  # agent clock + offset; the malformed line skipped
    assert [r[0].power_w for _, r in samples] == [100.0, 120.0]
