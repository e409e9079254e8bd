"""The management console of the queue service and the broker.

One web console for both servers: ``cmq serve`` serves it under
``/console``; ``cmq broker --http-port P`` serves it (with Prometheus
``/metrics``) on a port of its own, off unless asked. Pages: an overview
with live rates, a sortable, filterable, paged queue table, one queue's
page (attributes, depth over time, peek, send a test message, purge,
redrive a dead-letter queue) and, for the broker, exchanges and bindings
with a form that shows where a routing key goes.

- :mod:`cmq.console._model`: rate history and paging, sans-IO;
- :mod:`cmq.console._backends`: what is read and changed on each server;
- :mod:`cmq.console._app`: the ASGI app (who may use it, CSRF, routes);
- :mod:`cmq.console._broker_http`: the broker's HTTP port.

The front end is Jinja2 templates, one plain script and the vendored uPlot
(``static/vendor/uplot``, MIT; checked against its recorded digest by the
tests): no build step and no network at run time.
"""

from __future__ import annotations

from cmq.console._app import Access, ConsoleApp
from cmq.console._backends import Backend, BrokerBackend, Refused, ServiceBackend
from cmq.console._broker_http import BrokerHttp, render_metrics

__all__ = [
    "Access",
    "Backend",
    "BrokerBackend",
    "BrokerHttp",
    "ConsoleApp",
    "Refused",
    "ServiceBackend",
    "render_metrics",
]
