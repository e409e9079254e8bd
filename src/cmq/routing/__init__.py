"""AMQP-style routing on cmq: exchanges, a broker, and its client."""
