"""Standalone modules: embedded verbatim in an archive's repro.py, so they import nothing of reprokit."""
