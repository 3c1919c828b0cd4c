"""Prepare this machine's demo: an agent config under var/ (used by `make run`).

Later parts add a demo deployment here, so the pages show engines from the start.
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Write var/agent.yaml for an agent on this machine, if absent."

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
        self.stdout.write(str(config))
