"""The Celery app: tasks from every installed app, configured from settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")

app = Celery("llmgw_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
