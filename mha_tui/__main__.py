"""`python -m mha_tui` is the `mha-tui` command."""

from .cli import main

main()
