"""The stage kinds: one module (or package) per kind of stage, each holding everything
mha-tui knows about it: its rules, how its stage is built, how the check judges it, how a
cell is explained (`--why`) and what the quiz asks. The contract a kind keeps is stated once
in `base.py`; the kinds in the order their rules are asked, each with the reason for its
place, are the one table in `registry.py`. Helpers shared by kinds and not kinds themselves
are in `_parts/`.

This layer sits on records and ops and under recognise and judge, which both read it: it
never imports them (an import-linter `layers` contract). Never import torch, rich, textual
or typer here.
"""
