"""``python -m reprokit`` runs the CLI (for machines where the console script is not installed)."""

from reprokit.cli import main

main()
