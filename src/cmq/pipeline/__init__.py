"""The lab's data pipeline on PySpark.

- :mod:`cmq.pipeline.session`: build the SparkSession (local or ``--master``).
- :mod:`cmq.pipeline.jobs`: pure DataFrame -> DataFrame aggregates of the
  records whose contract is :mod:`cmq.pipeline.schema`.
- :mod:`cmq.pipeline.report`: the self-contained HTML page, drawn from the
  experiments it is handed (the lab's registry has them; this package
  imports nothing from the lab).
- :mod:`cmq.pipeline.stats`: intervals over runs and the verdict rules.
- :mod:`cmq.pipeline.source`: ``format("cmq")``, a Structured Streaming
  source of received cmq messages and a sink that pushes rows.

Only :mod:`cmq.pipeline.source` imports PySpark at import time (its classes
subclass PySpark's); the others import it when a function needs it, so
``import cmq.pipeline.report`` stays cheap.
"""
