"""Reduction passes, one per file. Each is a function ``run(reducer) -> None`` that proposes
smaller candidates through ``reducer.first_interesting``/``reducer.test`` and calls
``reducer.accept``; none loops to a fixed point on its own (the pipeline in shrink.py decides)."""
