"""`manage.py ensure_demo_key --key-file var/demo-api-key`: a demo tenant with one key, made once.

The key is written to the file, private from its creation, and printed once; a second run
finds the file and makes nothing (the key itself cannot be shown again: only its digest is kept).
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand
from django.db import transaction

from gateway.models import ApiKey, Tenant

TENANT = "demo"


class Command(BaseCommand):
    help = "Create the demo tenant and an API key for it, written to --key-file, unless that file exists."

    def add_arguments(self, parser):
        parser.add_argument("--key-file", required=True, type=Path)

    def handle(self, *args, key_file: Path, **options):
        if key_file.exists():
            self.stdout.write("exists")
            return
        with transaction.atomic():
            tenant, _ = Tenant.objects.get_or_create(name=TENANT)
            key = ApiKey(tenant=tenant, name="make run")
            secret = key.issue()
            key.save()
        # Private from its creation: never a moment when others may read it.
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secret)
        self.stdout.write(f"created {secret}")
