"""Any program: the deployment's arguments are the whole command line, `{port}` and `{model}` filled in.

An agent runs one only when its own config names the program (`command_programs`),
so whoever can write a deployment or a heartbeat reply cannot run what the node's
operator did not allow. Ready once its port accepts connections; its metrics are
its own affair.
"""

from __future__ import annotations

from agent.enginekinds.record import EngineKind, Readiness

KIND = EngineKind(
    name="command",
    label="command (arguments are the whole command line)",
    readiness=Readiness.PORT,
    needs_model=False,
)
