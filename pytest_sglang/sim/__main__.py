"""`python -m pytest_sglang.sim <SGLang launch flags>`: run the simulated SGLang server."""

from __future__ import annotations

import sys

from pytest_sglang.sim.server import main

if __name__ == "__main__":
    sys.exit(main())
