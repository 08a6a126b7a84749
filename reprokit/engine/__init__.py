"""Engines and verdicts: the Oracle, worker processes, activations, backends. Knows nothing of passes or archives."""
