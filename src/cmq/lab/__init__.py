"""The lab: benchmarks and experiments that measure cmq against real peers.

:mod:`cmq.lab.systems` holds one adapter module per system (the same few
names in each), :mod:`cmq.lab.runner` runs them in separate processes and
collects their results.
"""
