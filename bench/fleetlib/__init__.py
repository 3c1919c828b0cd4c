"""A paced fleet for bench/heartbeat.py: realistic bodies, an open-loop generator, CPU by process.

`bodies` builds what a node running engines sends (agent.protocol types);
`pacer` sends it on each node's own schedule from worker processes and counts
every slot, sent or not; `cpu` reads the control plane's CPU from /proc.
"""
