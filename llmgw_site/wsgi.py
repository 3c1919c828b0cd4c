import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_application = get_wsgi_application()

# After Django is set up: the heartbeat is answered before Django's handler (nodes/api/fastpath.py).
from nodes.api.fastpath import HeartbeatFastPath  # noqa: E402

application = HeartbeatFastPath(django_application)

# Last: what loading made lives as long as the worker, and full collections need not walk it (lib/collector.py).
from lib import collector  # noqa: E402

collector.freeze_loaded()
