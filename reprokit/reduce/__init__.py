"""Reduction core: the Reducer (current best, cache, journal, parallel speculation, stats) and
its passes (one file each in ``passes/``)."""
