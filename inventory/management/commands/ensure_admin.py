"""Create the first admin user if no superuser exists (used by `make run`)."""

from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create user 'admin' with the given password unless a superuser exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", required=True)

    def handle(self, *args, username, password, **options):
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("exists")
            return
        users.objects.create_superuser(username, email="", password=password)
        secret = Path(settings.VAR_DIR) / "admin-password"
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(f"{username} {password}\n")
        secret.chmod(0o600)
        self.stdout.write("created")
