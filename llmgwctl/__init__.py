"""`llmgw`: the operators' command line for the control plane's API (docs/api.md).

It runs on an operator's laptop, so it needs only the standard library and
`requests`, and never imports Django or anything of the control plane.
"""

__version__ = "0.1.0"
