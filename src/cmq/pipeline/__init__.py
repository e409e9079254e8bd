"""The lab's data pipeline on PySpark.

- :mod:`cmq.pipeline.session`: build the SparkSession (local or ``--master``).
- :mod:`cmq.pipeline.jobs`: pure DataFrame -> DataFrame aggregates of the
  records written by :mod:`cmq.lab.records`.
- :mod:`cmq.pipeline.report`: the self-contained HTML report and the
  registry of experiments (claims, figures, verdicts).
- :mod:`cmq.pipeline.bench`: what the pipeline itself costs, 1M to 10M records.

Nothing here imports PySpark at module import time, so ``import
cmq.pipeline`` stays cheap; the functions import it when called.
"""
