"""torchrun's ranks as the plugin sees them without torch: "[rank1]: " log prefixes, and members by their RANK.

The real two-rank server (benchmarks/tp_server, torch and gloo) is in tests/integration/test_tensor_parallel.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pytest_sglang.config.kinds import GENERIC
from pytest_sglang.launch.process import ServerProcess
from pytest_sglang.watch.extractor import extract_root_causes
from pytest_sglang.watch.prefixes import source_of, strip_prefixes

# What torch.distributed's excepthook prints (distributed_c10d.py, _set_excepthook), rank 0's consequence after.
TORCHRUN_LOG = """\
[rank1]: fault: raising in warmup step 2
[rank1]: Traceback (most recent call last):
[rank1]:   File "/srv/server.py", line 272, in main
[rank1]:     maybe_fault(args, step)
[rank1]: RuntimeError: injected fault on rank 1
[rank0]: Traceback (most recent call last):
[rank0]:   File "/srv/server.py", line 93, in step
[rank0]:     dist.all_reduce(partial)
[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:8092.
"""


def test_torch_rank_prefixes_name_the_source() -> None:
    assert strip_prefixes("[rank1]:   File \"x.py\", line 1, in f") == ("rank1", None, '  File "x.py", line 1, in f')
    assert strip_prefixes("[rank 0] Load weight begin") == ("rank0", None, "Load weight begin")
    assert source_of("[rank12]:[W1201 08:43:01 ProcessGroupNCCL.cpp:1]") == "rank12"
    assert source_of("[ranked] not a rank") is None


def test_a_rank_traceback_is_the_root_cause_naming_its_rank() -> None:
    causes = extract_root_causes(TORCHRUN_LOG.splitlines(), kind=GENERIC)
    assert causes[0].splitlines()[:2] == ["RuntimeError: injected fault on rank 1", "(raised on rank1)"]
    assert causes[1].splitlines()[1] == "(raised on rank0)"


# A root that starts two children with the environment torchrun's agent gives its workers, and one without.
TREE = """
import os, subprocess, time
for rank in ("0", "1"):
    subprocess.Popen(["sleep", "60"], env={**os.environ, "RANK": rank, "TORCHELASTIC_RUN_ID": "none"})
subprocess.Popen(["sleep", "61"], env={**os.environ, "RANK": "5"})
time.sleep(60)
"""


def test_torchrun_workers_are_members_named_by_rank(tmp_path: Path) -> None:
    server = ServerProcess([sys.executable, "-c", TREE], env=dict(os.environ), log_path=tmp_path / "t.log",
                           reap_on_parent_death=False)
    try:
        deadline = time.monotonic() + 10
        while len(server.members.names()) < 4:
            assert time.monotonic() < deadline, server.members.names()
            server.poll()
            time.sleep(0.05)
        names = sorted(server.members.names().values())
        assert names[:2] == ["rank0", "rank1"] and names[2].startswith("sleep 61"), names
    finally:
        server.stop(grace=1)
