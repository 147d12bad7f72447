"""benchmarks/real_harness.py: the profiles file the real-server benchmarks write is the one a user would, read
back by the Harness field for field (quotes, backslashes and odd names included) and accepted by start()."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from real_harness import RealProfile, harness_for  # noqa: E402


def test_the_benchmarks_profiles_read_back_as_written(tmp_path: Path) -> None:
    written = {
        "radix": RealProfile(kind="sglang", model="/models/tiny \"q\"", python=sys.executable,
                             args=("--device", "cpu", "--chat-template", "a\\b {x}"),
                             env={"PYTHONPATH": "/stub dir", "HF_HUB_OFFLINE": "1"}, startup_timeout=600.0),
        "no-radix.v2": RealProfile(kind="vllm", model="m", python=sys.executable, args=("--disable-radix-cache",)),
    }
    with harness_for(tmp_path, written) as harness:
        harness.start()
        read = harness.profiles().profiles
        assert sorted(read) == sorted(written)
        for name, want in written.items():
            got = read[name]
            assert (got.kind, got.model, got.python) == (want.kind, want.model, want.python)
            assert tuple(got.args) == tuple(want.args)
            assert dict(got.env) == dict(want.env)
            assert got.startup_timeout == want.startup_timeout
        assert harness.selected() == ["radix", "no-radix.v2"]
