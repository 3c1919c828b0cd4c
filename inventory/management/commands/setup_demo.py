"""Prepare this machine's demo (used by `make run`): an agent config under var/, and a demo deployment.

The deployment runs the stand-in engine (`python -m agent.demo_engine`) on CPU,
so the pages show engines, their cores and memory, and queue depth from the
start on a machine with no GPU and no model.
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from inventory.models import Deployment, Engine

DEMO_DEPLOYMENT = {
    "model_source": "demo",
    "engine": Engine.DEMO,
    "replicas": 2,
    "shards_per_replica": 1,
    "gpus_per_shard": 0,
    "memory_gb_per_shard": 1,
    "cpu_cores_per_shard": 1,
}


class Command(BaseCommand):
    help = "Write var/agent.yaml for an agent on this machine, and create the demo deployment, if absent."

    def add_arguments(self, parser):
        parser.add_argument("--var-dir", default=str(settings.VAR_DIR))
        parser.add_argument("--control-plane", default="http://127.0.0.1:8000")

    def handle(self, *args, var_dir, control_plane, **options):
        var = Path(var_dir)
        config = var / "agent.yaml"
        if not config.exists():
            config.write_text(
                f"control_plane: {control_plane}\n"
                f"join_token_file: {var / 'join-token'}\n"
                f"state_dir: {var / 'agent-state'}\n"
                "interval: 5\n"
                "labels:\n  role: demo\n"
            )
        # Left alone once it exists: an operator may have scaled it or removed its replicas on purpose.
        Deployment.objects.get_or_create(name="demo", defaults=DEMO_DEPLOYMENT)
        self.stdout.write(str(config))
