"""mha-tui: a terminal explainer for PyTorch multi-head attention.

Importing the package must stay cheap (no torch, no textual): the CLI's --help and
--version depend on it.
"""

__version__ = "0.1.0"
