"""The shrink run: its named steps, the Reducer (one current best, cache, journal, budget, stats),
the one evaluator, and the passes (one file each in ``passes/``)."""
