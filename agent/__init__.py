"""The llmgw node agent: discovers the node, measures its load, runs its engines, and heartbeats.

It never imports Django; it needs only psutil-free standard library reads of /proc and /sys,
requests, PyYAML and msgspec (and nvidia-ml-py where there are GPUs).
"""

__version__ = "0.1.0"
