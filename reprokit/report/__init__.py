"""The report archive: bundle, archive, redaction, issue words, rendering. Never changes a verdict."""
