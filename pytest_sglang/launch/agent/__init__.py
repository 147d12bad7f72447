"""The agent that pytest-sglang runs on an ssh host: it owns the remote server's tree there and reads its GPUs.

Not installed on the host: launch/remote.py sends these modules' sources over ssh's stdin and the host's python
runs them (``python -c BOOTSTRAP pytest-sglang MODE``), so the host needs no pytest-sglang, only a Python 3.7+
and its standard library. What the host reads, one JSON line each: LOADER's source (BOOTSTRAP executes it),
the modules of SHIPPED as [name, source] pairs (LOADER puts each in sys.modules under its own name, in this
order, and calls main's ``main``), then the mode's spec. Nothing passes through a shell: the server's argv
and environment arrive as JSON. So each module imports only the standard library and, by ``from ... import``
of its full name, the modules shipped before it; never this package (it is not sent).

    tree.py  the server's tree: supervise (start, watch, tear down), stream (the log), sweep (the last net)
    gpus.py  the host's GPUs: machine (the baseline key's facts), gpus (telemetry readings, GPU_PROTOCOL)
    main.py  the mode table and the process's end
"""

from __future__ import annotations

import json
from pathlib import Path

SHIPPED = ("tree", "gpus", "main")  # import order: each may import those before it
LOADER = """import json, sys, types
for name, source in json.loads(sys.stdin.buffer.readline()):
    module = sys.modules[name] = types.ModuleType(name)
    exec(compile(source, name.replace(".", "/") + ".py", "exec"), module.__dict__)
module.main(sys.argv)
"""


def program() -> str:
    """The agent as the host reads it before its spec: LOADER, then the shipped modules (a JSON line each)."""
    here = Path(__file__).parent
    modules = [[f"{__name__}.{name}", (here / f"{name}.py").read_text(encoding="utf-8")] for name in SHIPPED]
    return json.dumps(LOADER) + "\n" + json.dumps(modules) + "\n"
