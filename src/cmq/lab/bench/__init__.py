"""Benchmarks and local test servers, kept out of the library's packages.

- :mod:`.sqs`: the queue service's benchmarks (``cmq sqsbench``) and the
  helpers the ``bdqs`` experiment runs them with (moto, SQLite stores).
- :mod:`.redis_local`: a throwaway local Redis Cluster for benchmarks and tests.
- :mod:`.broker`, :mod:`.broker_durable`: ``cmq broker bench`` and
  ``cmq broker bench-durable``.
- :mod:`.pipeline`: what the Spark pipeline itself costs
  (``python -m cmq.lab.bench.pipeline``).
"""
