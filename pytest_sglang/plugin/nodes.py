"""The harness's outcomes in pytest's terms: a failure that shows the plugin's message alone, a skip for what did
not run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

from pytest_sglang.errors import NotRunError, PluginError, ServerDiedError


def fail_with(exc: BaseException) -> NoReturn:
    """Fail with our message alone: no traceback of the plugin, no "During handling of..." chain."""
    raise pytest.fail.Exception(str(exc), pytrace=False) from None


@contextmanager
def as_outcome(*, deaths: bool = True) -> Iterator[None]:
    """The harness's errors as a test's outcome: what did not run skips, a check or a request that failed fails
    with its message alone. ``deaths``: a server's death too; else it passes through, for pytest_runtest_call to
    tell as the crash of the test's sglang_server."""
    try:
        yield
    except ServerDiedError as exc:
        if not deaths:
            raise
        fail_with(exc)
    except NotRunError as exc:
        pytest.skip(str(exc))
    except PluginError as exc:
        fail_with(exc)
