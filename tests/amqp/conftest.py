"""Fixtures of the AMQP suite's tests: the pipeline tests' shared SparkSession."""

from __future__ import annotations

from tests.pipeline.conftest import spark

__all__ = ["spark"]
