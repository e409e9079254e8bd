"""Fixtures of the lab tests: the pipeline tests' SparkSession, shared.

Starting Spark costs 5-30 s here, so the one end-to-end test that needs it
takes the same session-scoped ``spark`` fixture as tests/pipeline (one JVM
per pytest run, whichever directory asks first).
"""

from __future__ import annotations

from tests.pipeline.conftest import spark

__all__ = ["spark"]
