"""Development tools shared by `scripts/`, `bench/` and `tests/`: the local stack, free ports, private services.

`python -m devstack` is `make run`. Nothing in agent, inventory, nodes or llmgw_site
imports this package: it starts and breaks the control plane, it is no part of it.
"""
