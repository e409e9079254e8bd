"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cmq import _impl

#: The cores the sans-IO and driver tests run against: both where the
#: compiled one was built (bootstrap builds it where gcc is), else the pure one.
CORES = ["compiled", "python"] if _impl.available() else ["python"]


@pytest.fixture(scope="module", params=CORES)
def core(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module's tests once per core (``pytestmark = pytest.mark.usefixtures("core")``).

    Objects take their core when they are made, so everything a test makes
    runs on the core named by the test's id.
    """
    with _impl.using(request.param):
        yield request.param
