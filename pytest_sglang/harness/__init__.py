"""The pytest-free core of a session: :class:`Harness` and the records it hands out. A script, a notebook or the
plugin drives it the same way; it never imports pytest.

    core.py      the Harness: profiles, servers (every origin), measurements, the report and the history
    settings.py  what a session asks for (the plugin reads it from its options)
    measure.py   benchmarks, baseline checks and A/B rounds, recorded in the ledger
    results.py   the session's results by profile, for comparisons (xdist workers' included)
    pool.py      the servers an A/B comparison needs alive at once
    history.py   the run history's session side;  workers.py  the pytest-xdist controller's and workers' work
    node.py      which test a measurement belongs to (its node id, its junit properties)
"""

from pytest_sglang.harness.core import Finished, Harness
from pytest_sglang.harness.node import TestRef
from pytest_sglang.harness.settings import Settings

__all__ = ["Finished", "Harness", "Settings", "TestRef"]
