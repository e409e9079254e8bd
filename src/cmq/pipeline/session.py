"""Build the SparkSession the pipeline runs on.

Local mode (``local[*]``) is the embedded default; ``master`` takes any
Spark master URL (``spark://host:7077``, ``yarn``, ``k8s://...``) and the
same jobs run on that cluster. Start-up costs about 5 s cold here, so build
one session per process and pass it around.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from cmq._errors import ConfigError
from cmq._extras import optional_imports

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_DRIVER_JAVA_OPTIONS",
    "DEFAULT_MASTER",
    "QUICK_START_JAVA_OPTIONS",
    "SessionConfig",
    "build_session",
]

#: All local cores: the lab's data fits one machine.
DEFAULT_MASTER: Final = "local[*]"
#: The serial collector: one less thread busy on a 2-core machine. Tiered
#: compilation stays on (C2 for hot code): a quick lab writes about 1.8M
#: records, and on the summary job over 1M records C2 ran about 2.5x faster
#: than C1 alone (-XX:TieredStopAtLevel=1), which only saves about a second
#: of start-up (measured here). Tests, whose data is tiny, keep C1 alone.
DEFAULT_DRIVER_JAVA_OPTIONS: Final = "-XX:+UseSerialGC"
#: The JVM options of short sessions over little data (tests): C1 alone
#: starts about a second faster.
QUICK_START_JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Our aggregates group a few hundred keys: Spark's default of 200 shuffle
#: partitions would mean 200 near-empty tasks per stage.
DEFAULT_SHUFFLE_PARTITIONS: Final = 8
#: A 1M-row aggregate peaks near 1.5 GB here; 10M rows spill windows to disk
#: rather than fail with 2 GB.
DEFAULT_DRIVER_MEMORY: Final = "2g"


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """How to build the pipeline's SparkSession.

    Raises:
        ConfigError: on construction, for an empty master or app name or
            fewer than one shuffle partition.
    """

    master: str = DEFAULT_MASTER
    """Spark master URL; ``local[*]`` runs in this process's JVM."""
    app_name: str = "cmq-pipeline"
    """Application name shown by the cluster manager."""
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS
    """``spark.sql.shuffle.partitions``."""
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    """``spark.driver.memory`` (only takes effect when this call starts the JVM)."""
    driver_java_options: str = DEFAULT_DRIVER_JAVA_OPTIONS
    """``spark.driver.extraJavaOptions``."""
    ui: bool = False
    """Serve the Spark web UI (off: it takes a port and start-up time)."""
    log_level: str = "ERROR"
    """Spark's log level once started (Spark's INFO lines drown our output)."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """Any other Spark settings, passed through unchanged."""

    def __post_init__(self) -> None:
        if not self.master:
            raise ConfigError("SessionConfig.master must not be empty")
        if not self.app_name:
            raise ConfigError("SessionConfig.app_name must not be empty")
        if self.shuffle_partitions < 1:
            raise ConfigError(
                f"SessionConfig.shuffle_partitions must be at least 1, got {self.shuffle_partitions}"
            )

    @property
    def is_local(self) -> bool:
        """Whether the master runs everything in this machine's JVM."""
        return self.master == "local" or self.master.startswith("local[")


def prepare_environment(config: SessionConfig) -> None:
    """Set the environment Spark's Python workers inherit.

    Without ``PYSPARK_PYTHON`` the workers run whatever ``python3`` is on the
    PATH, which lacks this virtualenv's packages (cmq itself, for the data
    source). ``SPARK_LOCAL_IP`` silences the loopback-address warning, but
    only in local mode: on a cluster the executors must reach the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if config.is_local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def build_session(config: SessionConfig | None = None) -> SparkSession:
    """Start (or reuse) a SparkSession as ``config`` says.

    If a session already runs in this process it is returned with the SQL
    settings applied; JVM settings (memory, Java options) cannot change then.

    Raises:
        MissingExtra: PySpark (the ``lab`` extra) is not installed.
    """
    config = config or SessionConfig()
    with optional_imports("the Spark pipeline"):
        from pyspark.sql import SparkSession
    prepare_environment(config)
    builder = (
        SparkSession.builder.master(config.master)
        .appName(config.app_name)
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config("spark.driver.memory", config.driver_memory)
        .config("spark.driver.extraJavaOptions", config.driver_java_options)
        .config("spark.ui.enabled", "true" if config.ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Our timestamps are int64 ns and UTC; never let the host's zone in.
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in config.extra.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(config.log_level)
    spark.conf.set("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
    return spark
