"""A sampled slice of bench/corpus_sweep.py in CI: models of the onnx wheel's backend test data
through check under four targets, and shrink → verify → audit where they diverge. No internal
error (exit 70) anywhere; every archive shrink writes reproduces under verify."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import corpus_sweep  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_sampled_slice_of_the_backend_test_corpus_has_no_internal_error():
    models = corpus_sweep.pick(corpus_sweep.collect(corpus_sweep.SHIPPED, "", 0), 6)
    assert len(models) == 6
    rows = corpus_sweep.sweep(models, corpus_sweep.TARGETS, jobs=2, timeout=240, shrink=True)
    assert corpus_sweep.internal_errors(rows) == []
    assert all(r["check"]["exit"] in (0, 1, 3, 4, 5) for r in rows), [r for r in rows if r["check"]["exit"] not in (0, 1, 3, 4, 5)]
    for row in rows:
        if "verify" in row:  # an archive was written: it reproduces (exit 1)
            assert row["verify"]["exit"] == 1, row
