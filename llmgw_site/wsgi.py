import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_application = get_wsgi_application()

# After Django is set up: the heartbeat is answered before Django's handler (nodes/api/fastpath.py).
from nodes.api.fastpath import HeartbeatFastPath  # noqa: E402

application = HeartbeatFastPath(django_application)
