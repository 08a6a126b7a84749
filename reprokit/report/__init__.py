"""The report archive: bundle, archive, redaction, issue words, rendering, environment fingerprint. Never changes a verdict."""
