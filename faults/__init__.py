"""Fault campaigns: kills, a full disk, racing readers and writers, injected into real checkpoint
stores and run directories, with what each lost counted.

    python -m faults.reliability                 # every campaign once, writes RELIABILITY.md

Apart from bench/, which measures time: these count losses. Both run from the checkout only (the
installed package is hpc alone); they share bench.common's scratch context and bench.report's tables.
"""
