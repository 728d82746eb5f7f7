"""``python -m rinwa_index`` runs the command line."""

from .cli import main

main()
