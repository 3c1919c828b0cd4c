"""The stack as `make run` starts it, for the operators' API end-to-end test, imported in this one place.

(The launcher is moving into its own package; this import is the one to change.)
"""

from scripts.stack import Stack

__all__ = ["Stack"]
