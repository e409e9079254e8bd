"""One SparkSession for the whole test session: local[1], one shuffle partition.

Starting Spark costs about 5 s, so every Spark test shares this session;
tests that need it take the ``spark`` fixture and carry the ``spark`` marker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Before any JVM starts: the Python workers must run this interpreter (it has
# cmq installed), and loopback avoids the "resolves to a loopback address" warning.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="PySpark is in the 'lab' extra")
    from cmq.pipeline.session import QUICK_START_JAVA_OPTIONS, SessionConfig, build_session

    session = build_session(
        SessionConfig(
            master="local[1]", shuffle_partitions=1, driver_memory="1g", app_name="cmq-tests",
            driver_java_options=QUICK_START_JAVA_OPTIONS,
        )
    )  # fmt: skip
    yield session
    session.stop()
