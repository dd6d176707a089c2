"""The sizes the app's layout follows: the smallest terminal, where the rail and the
drill-down's panel go, when a stage's box starts folded, how wide a pane formats.
Never import typer, torch or the CLI here.
"""

MIN_WIDTH, MIN_HEIGHT = 60, 16
RAIL_MIN_WIDTH = 80
"""Narrower than this, the stage heading ("2/11 project") stands in for the rail."""
SIDE_PANEL_MIN_WIDTH = 140
"""From this width the drill-down's panel stands beside the stage; narrower, below it."""
NARROW_FOOTER_LEAVES_OUT = frozenset({"wrong_view", "drill"})
"""Below RAIL_MIN_WIDTH the footer drops these keys, so that `? Help` and `q Quit` fit."""
BOX_SHARE = 3
"""A stage's box (shape, code, explanation) that would take more than 1/BOX_SHARE of the
terminal's height starts folded to shape and code: the numbers come first (`e` unfolds)."""
MAX_DECIMALS = 8
MAX_COLS = 64  # more than any pane shows at 4 decimals
