"""The soak's parts: the simulated fleet, the stack's faults, the end checks."""
