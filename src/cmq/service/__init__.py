"""The queue service: BlueDove-style queues behind the Amazon SQS JSON protocol.

Layers, from the wire inwards:

- :mod:`cmq.service.app` the ASGI edge (HTTP, errors to responses, metrics);
- :mod:`cmq.service.protocol` the SQS JSON protocol and MD5s, sans-IO;
- :mod:`cmq.service.operations` SQS semantics, the K hint, visibility,
  dead-letter queues, FIFO, delays; no HTTP;
- :mod:`cmq.service.store` one coroutine per operation: memory (the test
  double), SQLite (embedded default) and Redis Cluster.
"""

from __future__ import annotations

from cmq.service.config import ServiceConfig, StoreConfig
from cmq.service.operations import QueueService
from cmq.service.store import MemoryStore, Store, open_store

__all__ = ["MemoryStore", "QueueService", "ServiceConfig", "Store", "StoreConfig", "open_store"]
