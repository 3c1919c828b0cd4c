"""Prepare this machine's demo (used by `make run`): an agent config under var/, and the demo deployments.

Two deployments, both on CPU:

- `smollm2`: SmolLM2-135M-Instruct (GGUF) on llama.cpp, a real model on a real engine,
  instruction-tuned with a chat template, so it answers questions. Its
  weights are fetched into var/models/ (`python -m agent.model_fetch`, started in the
  background by `make run`), where the agent's `model_dirs` finds them; placement
  waits for them, then the agent builds llama.cpp (or copies it from the shared
  cache) in the background while the node page shows the install, and starts it.
- `demo`: the stand-in engine (`python -m agent.demo_engine`), which needs no model
  or build, so the pages show engines, their cores and memory, and queue depth from
  the start; it is also what simulated fleets run.
"""

import argparse
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from agent.model_fetch import SMOLLM2_135M_INSTRUCT
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
# Where the demo's model goes, under the var directory; the agent's only model directory.
MODEL_DIR = "models"
# Plain ChatML, the format SmolLM2 was tuned on. The GGUF's own template adds a default
# system prompt ("You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
# and behind it this 135M model answered "What is the capital of France?" at temperature 0
# with "L'Étoile, la Marseillaise, …"; with plain ChatML, or any system prompt of the
# client's own, "The capital of France is Paris." (llama-server of llama-cpp-python 0.3.36).
MODEL_ARGUMENTS = "--chat-template chatml"
MODEL_DEPLOYMENT = {
    "engine": Engine.LLAMA_CPP,
    "arguments": MODEL_ARGUMENTS,
    "replicas": 1,
    "shards_per_replica": 1,
    "gpus_per_shard": 0,
    # 98 MB of weights and an 8k context's cache, well under 0.5 GB resident; the claim leaves room.
    "memory_gb_per_shard": 1,
    # Undeclared: llama-server then uses every core, and the demo engines' claims still fit a 2-core machine.
    "cpu_cores_per_shard": 0,
}


def model_path(var: Path) -> Path:
    """Where `python -m agent.model_fetch VAR/models` puts the model, and so the deployment's model source."""
    return var.resolve() / MODEL_DIR / SMOLLM2_135M_INSTRUCT.filename


class Command(BaseCommand):
    help = "Write var/agent.yaml for an agent on this machine, and create the demo deployments, if absent."

    def add_arguments(self, parser):
        parser.add_argument("--var-dir", default=str(settings.VAR_DIR))
        parser.add_argument("--control-plane", default="http://127.0.0.1:8000")
        parser.add_argument("--ca-file", default="", help="the CA the agent trusts for an https:// control plane")
        parser.add_argument(
            "--real-model",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also deploy SmolLM2-135M-Instruct on llama.cpp (--no-real-model: the stand-in engine only)",
        )

    def handle(self, *args, var_dir, control_plane, ca_file, real_model, **options):
        var = Path(var_dir)
        models = var.resolve() / MODEL_DIR
        config = var / "agent.yaml"
        if not config.exists():
            config.write_text(
                f"control_plane: {control_plane}\n"
                + (f"ca_file: {ca_file}\n" if ca_file else "")
                + f"join_token_file: {var / 'join-token'}\n"
                f"state_dir: {var / 'agent-state'}\n"
                "interval: 5\n"
                "labels:\n  role: demo\n"
                f"model_dirs:\n  - {models}\n"
            )
        elif "model_dirs:" not in config.read_text():
            # A config written before the demo had a model: the agent must look where the model goes.
            with config.open("a") as out:
                out.write(f"model_dirs:\n  - {models}\n")
        models.mkdir(parents=True, exist_ok=True)
        # Left alone once they exist: an operator may have scaled them or removed their replicas on purpose.
        Deployment.objects.get_or_create(name="demo", defaults=DEMO_DEPLOYMENT)
        if real_model:
            Deployment.objects.get_or_create(
                name="smollm2", defaults={**MODEL_DEPLOYMENT, "model_source": str(model_path(var))}
            )
        self.stdout.write(str(config))
