"""The AMQP paper's stock-exchange simulation on the cmq broker.

- :mod:`.book`: the matching engine, a sans-IO price-time priority order book.
- :mod:`.codec`: the compact wire form (5 to 9 bytes a message).
"""
