"""The AMQP/Qpid paper's benchmark suite on the cmq broker, beside RabbitMQ.

- :mod:`cmq.lab.experiments.amqp.transport`: one client interface over the two brokers.
- :mod:`cmq.lab.experiments.amqp.suite`: points (topology + load) run in worker processes.
- :mod:`cmq.lab.experiments.amqp.plans`: the five benchmarks' plans, profiles and records.
- :mod:`cmq.lab.experiments.amqp.report`: their report sections and claims.

The lab experiments are registered by :mod:`cmq.lab.experiments.amqp.experiment`.
"""
