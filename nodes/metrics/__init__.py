"""The fleet in Prometheus' exposition format, from one /metrics on the control plane.

`families` names every exported family; `loads` renders a node's load into
sample lines when its heartbeat arrives; `inventory` reads the inventory with a
fixed number of queries; `collector` joins both with the control plane's own
counters on each scrape; `exposition` writes the answer; `views` serves it.
"""
