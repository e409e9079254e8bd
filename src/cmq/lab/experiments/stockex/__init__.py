"""The AMQP paper's stock-exchange simulation on the cmq broker.

- :mod:`.book`: the matching engine, a sans-IO price-time priority order book.
- :mod:`.codec`: the compact wire form (5 to 9 bytes a message).
- :mod:`.roles`: the gateway and engine processes.
- :mod:`.reporter`: the statistics reporter (Spark Structured Streaming on ``format("cmq")``).
- :mod:`.run`: one run: broker, engine, gateway, reporter.
- :mod:`.report`: its records, report section and claims.

The lab experiment is :mod:`cmq.lab.experiments.stockex.experiment` (``cmq lab --only stockex``).
"""
