"""Create the first admin user if no superuser exists (used by `make run`).

The password is read from stdin, one line: a command line is shown by `ps` to
every user of the machine. Keeping it somewhere is the caller's business.
"""

import sys

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create user 'admin' with the password read from stdin unless a superuser exists."
    # Tests hand call_command a stream in place of the process's stdin.
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password-stdin", action="store_true", required=True, help="read the password from stdin")

    def handle(self, *args, username, **options):
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("exists")
            return
        password = (options.get("stdin") or sys.stdin).readline().rstrip("\n")
        if not password:
            raise CommandError("no password on stdin")
        users.objects.create_superuser(username, email="", password=password)
        self.stdout.write("created")
