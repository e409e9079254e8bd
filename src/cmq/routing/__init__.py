"""AMQP-style routing on cmq: exchanges, a broker, and its client.

- :mod:`cmq.routing.exchanges`: pure matching (direct, fanout, topic trie).
- :class:`BrokerCore`: the whole broker as a sans-IO object (``now`` passed in).
- :class:`Broker`: that core served on a cmq endpoint (``cmq broker --port P``),
  and with ``amqp_port`` also over AMQP 0-9-1 on TCP (``cmq broker --amqp-port
  5673``; :mod:`cmq.routing._amqp` is one connection as a sans-IO object,
  :mod:`cmq.routing._amqp_server` the listener thread), and with ``data_dir``
  keeping durable exchanges, queues, bindings and persistent messages in
  SQLite (:mod:`cmq.routing._store`; ``cmq broker`` uses ``./cmq-data/``).
- :class:`Users`: who may log in over AMQP and, from RabbitMQ's definitions,
  what each may do (:class:`Permissions`, RabbitMQ's configure/write/read).
- :class:`BrokerClient` (threads) and :class:`AsyncBrokerClient` (asyncio):
  ``declare_exchange``, ``declare_queue``, ``bind``, ``unbind``, ``publish``,
  ``consume`` (a :class:`Consumer` iterator / :class:`AsyncConsumer` async
  iterator).

Delivery guarantee: at least once for consumers that acknowledge (the
default), at most once with ``no_ack``. See :mod:`cmq.routing._core`.
"""

from __future__ import annotations

from cmq.routing._client import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_PREFETCH,
    AsyncBrokerClient,
    AsyncConsumer,
    BrokerClient,
    Consumer,
)
from cmq.routing._core import BrokerConfig, BrokerCore, BrokerStats, Outgoing, Overflow, QueueStats
from cmq.routing._protocol import Delivery, ErrorCode
from cmq.routing._server import Broker, tls_context
from cmq.routing._users import Permissions, Users
from cmq.routing.exchanges import (
    Binding,
    DirectExchange,
    Exchange,
    ExchangeType,
    FanoutExchange,
    TopicExchange,
    make_exchange,
    topic_matches,
)

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_PREFETCH",
    "AsyncBrokerClient",
    "AsyncConsumer",
    "Binding",
    "Broker",
    "BrokerClient",
    "BrokerConfig",
    "BrokerCore",
    "BrokerStats",
    "Consumer",
    "Delivery",
    "DirectExchange",
    "ErrorCode",
    "Exchange",
    "ExchangeType",
    "FanoutExchange",
    "Outgoing",
    "Overflow",
    "Permissions",
    "QueueStats",
    "TopicExchange",
    "Users",
    "make_exchange",
    "tls_context",
    "topic_matches",
]
