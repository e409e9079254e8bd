"""Stores: where queues and messages live (see :mod:`cmq.service.store.base`)."""

from __future__ import annotations

from cmq.service.config import StoreConfig
from cmq.service.store.base import Store
from cmq.service.store.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "open_store"]


def open_store(config: StoreConfig) -> Store:
    """Build (not yet open) the store that ``config`` describes."""
    if config.kind == "memory":
        return MemoryStore()
    if config.kind == "sqlite":
        from cmq.service.store.sqlite import SqliteStore

        return SqliteStore(config.path, synchronous=config.synchronous)
    from cmq.service.store.redis_cluster import RedisClusterStore

    return RedisClusterStore(
        config.nodes, wait_replicas=config.wait_replicas, wait_timeout_ms=config.wait_timeout_ms
    )
