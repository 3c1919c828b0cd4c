"""Settings, every one of them from the environment (see .env.example).

With nothing set these are production settings (DEBUG off): then SECRET_KEY and
ALLOWED_HOSTS are required, and `manage.py check --deploy` is clean. Development
asks for DEBUG=true by name (`make run`, the tests' settings); then SQLite under
var/, Redis on localhost and a key kept under var/ need nothing else.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from llmgw_site.env import EnvError, env_bool, env_float, env_int, env_list, env_networks, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LLMGW_VAR_DIR", str(BASE_DIR / "var")))

try:
    # Production unless asked: a forgotten variable must not serve tracebacks and plain-HTTP cookies.
    DEBUG = env_bool("DEBUG", False)
    SECRET_KEY = env_str("SECRET_KEY")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
    DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'llmgw.sqlite3'}")
    REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
    PROMETHEUS_URL = env_str("PROMETHEUS_URL", "http://127.0.0.1:9090")
    LLMGW_JOIN_TOKEN = env_str("LLMGW_JOIN_TOKEN", "")
    LLMGW_METRICS_TOKEN = env_str("LLMGW_METRICS_TOKEN", "")
    # Engines answer only their deployment's secret (the gateway's); llama-server keeps /metrics behind
    # it too, so this fleet-wide key, which Prometheus sends, is given to llama-server as a second one.
    LLMGW_ENGINE_SCRAPE_KEY = env_str("LLMGW_ENGINE_SCRAPE_KEY", "")
    LLMGW_HEARTBEAT_INTERVAL = env_float("LLMGW_HEARTBEAT_INTERVAL", 5.0, minimum=0.1)
    LLMGW_UNREACHABLE_AFTER = env_float("LLMGW_UNREACHABLE_AFTER", 30.0, minimum=0.1)
    LLMGW_LOST_AFTER = env_float("LLMGW_LOST_AFTER", 300.0, minimum=0.1)
    # The share of the fleet unreachable at once above which the sweep marks no node lost
    # (inventory/liveness.py): then the fault is more likely ours or the network's.
    LLMGW_DISRUPTION_THRESHOLD = env_float("LLMGW_DISRUPTION_THRESHOLD", 0.55, minimum=0.0, maximum=1.0)
    # A heartbeat that waited longer than this in the proxy for a web worker means the control plane is
    # behind on its heartbeats, and the sweep blames no node for the silence that causes (inventory/sweep.py).
    LLMGW_BEHIND_AFTER = env_float("LLMGW_BEHIND_AFTER", 1.0, minimum=0.0)
    LLMGW_LOAD_MAX_AGE = env_float("LLMGW_LOAD_MAX_AGE", 60.0, minimum=0.1)
    # How long a replica leaving (drained, moved, scaled down) keeps its engine running while the
    # gateways report requests in flight on it (inventory/drainhold.py); then it is stopped anyway.
    LLMGW_DRAIN_DEADLINE = env_float("LLMGW_DRAIN_DEADLINE", 300.0, minimum=0.0)
    LLMGW_BEAT_PERIOD = env_float("LLMGW_BEAT_PERIOD", 5.0, minimum=0.1)
    # How often Celery beat renders the fleet's part of /metrics ahead of the scrapes (nodes/metrics/prerender.py).
    LLMGW_METRICS_RENDER_PERIOD = env_float("LLMGW_METRICS_RENDER_PERIOD", 10.0, minimum=1.0)
    # How often Celery beat computes the fleet's totals and sort figures for the cluster page
    # (nodes/fleetload.py): the page's own refresh period.
    LLMGW_FLEET_LOAD_PERIOD = 5.0
    # Whether a web worker whose heartbeat finds Redis emptied refills the cards and shard lists itself, at the
    # web tier's weight, rather than leave it to Celery (inventory/refill.py). Off only in the tests of
    # other things, whose threads would outlive them.
    LLMGW_REFILL_AFTER_LOSS = True
    # Routes an empty view for bench/heartbeat.py's ceiling; never set in production.
    LLMGW_BENCH_EMPTY_VIEW = env_bool("LLMGW_BENCH_EMPTY_VIEW", False)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
    # A request carrying a credential over plain HTTP is refused, not redirected (nodes/entry.py):
    # by the time a redirect is sent, the secret has crossed the network in the clear.
    LLMGW_REQUIRE_HTTPS = env_bool("LLMGW_REQUIRE_HTTPS", not DEBUG)
    # For a client on this host (an agent or `llmgw` beside the control plane) talking to it over loopback.
    LLMGW_PLAIN_HTTP_FROM_LOOPBACK = env_bool("LLMGW_PLAIN_HTTP_FROM_LOOPBACK", False)
    CONN_MAX_AGE = env_int("CONN_MAX_AGE", 60, minimum=0)
    # Agent API limits (nodes/ratelimit.py), per minute, shared by all workers through Redis.
    LLMGW_REGISTER_PER_MINUTE = env_int("LLMGW_REGISTER_PER_MINUTE", 20, minimum=1)
    # Default: ten times what an agent beating at the configured interval sends.
    LLMGW_HEARTBEAT_PER_MINUTE = env_int(
        "LLMGW_HEARTBEAT_PER_MINUTE", max(120, int(600 / LLMGW_HEARTBEAT_INTERVAL)), minimum=1
    )
    LLMGW_AUTH_FAILURES_PER_MINUTE = env_int("LLMGW_AUTH_FAILURES_PER_MINUTE", 30, minimum=1)
    LLMGW_PROXY_HOPS = env_int("LLMGW_PROXY_HOPS", 0, minimum=0)
    # Login lockout (django-axes): wrong passwords allowed per user name and, separately,
    # per address before either is locked out for the cool-off.
    LLMGW_LOGIN_FAILURE_LIMIT = env_int("LLMGW_LOGIN_FAILURE_LIMIT", 5, minimum=1)
    LLMGW_LOGIN_COOLOFF_MINUTES = env_float("LLMGW_LOGIN_COOLOFF_MINUTES", 15.0, minimum=0.1)
    # Networks whose addresses an agent may name as its management address, trusted as the
    # node's address (inventory/endpoints.py); empty: only the address it registers from.
    LLMGW_TRUSTED_TARGET_NETWORKS = env_networks("LLMGW_TRUSTED_TARGET_NETWORKS")
    # Node events: a repeat of the same kind and subject within this many seconds of the last
    # counts on that event instead of adding one (0: never folded); events are kept this many
    # days after they last happened, then pruned by beat (inventory/events.py).
    LLMGW_EVENT_COALESCE_SECONDS = env_float("LLMGW_EVENT_COALESCE_SECONDS", 600.0, minimum=0.0)
    LLMGW_EVENT_RETENTION_DAYS = env_int("LLMGW_EVENT_RETENTION_DAYS", 90, minimum=1)
except EnvError as exc:
    raise ImproperlyConfigured(str(exc)) from None

if LLMGW_LOST_AFTER <= LLMGW_UNREACHABLE_AFTER:
    raise ImproperlyConfigured("LLMGW_LOST_AFTER must be longer than LLMGW_UNREACHABLE_AFTER")

if not DEBUG:
    if not SECRET_KEY:
        raise ImproperlyConfigured("SECRET_KEY is required when DEBUG is false")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS is required when DEBUG is false")
elif not SECRET_KEY:
    # Development only: a fixed key would be a secret in the repository, so
    # each checkout makes its own and keeps it under var/.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        import secrets

        from lib.private_files import write_private

        write_private(_key_file, secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "django_htmx",
    "template_partials",
    "inventory",
    "nodes",
    "rest_framework",
    "drf_spectacular",
    "opsapi",
    "gateway",
]

MIDDLEWARE = [
    # POST /api/v1/heartbeat never reaches this chain: llmgw_site/wsgi.py answers it first (nodes/api/fastpath.py).
    "llmgw_site.middleware.AccessLogMiddleware",
    # Before anything reads the Host or serves a byte: the same checks as the heartbeat's fast path.
    "nodes.entry.EntryMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "llmgw_site.security.SecurityHeadersMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# AxesStandaloneBackend refuses a locked-out user name or address before the password
# is even checked, so the right password fails too until the cool-off ends or an
# operator clears it (`manage.py axes_reset`, or the admin's "Access attempts").
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = LLMGW_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LLMGW_LOGIN_COOLOFF_MINUTES)
# Each entry is counted on its own: one user name tried from many addresses is locked,
# and so is one address trying many user names.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
# The same address the agent API's limits count, so LLMGW_PROXY_HOPS applies here too.
AXES_CLIENT_IP_CALLABLE = "nodes.ratelimit.client_address"
AXES_LOCKOUT_TEMPLATE = "admin/locked_out.html"

ROOT_URLCONF = "llmgw_site.urls"
WSGI_APPLICATION = "llmgw_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=CONN_MAX_AGE)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets the web server read while the Celery worker writes.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# The operators' API (opsapi/, docs/api.md): JSON only, personal tokens only, refusals as JSON naming the field.
REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["opsapi.auth.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["opsapi.auth.ReadOrOperate"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "opsapi.errors.handle",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw operators' API",
    "DESCRIPTION": "Nodes, deployments and events for scripts and the `llmgw` command (docs/api.md).",
    "VERSION": "1",
    # 3.1: its schemas are JSON Schema, so a test validates real answers with jsonschema alone.
    "OAS_VERSION": "3.1.0",
    "SCHEMA_PATH_PREFIX": "/api/ops/v1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "inventory.models.choices.NodeState",
        "AdminStateEnum": "inventory.models.choices.AdminState",
        "LivenessEnum": "inventory.models.choices.Liveness",
        "ReplicaStateEnum": "inventory.models.deployments.ReplicaState",
    },
}

LOGIN_URL = "/admin/login/"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Celery: Redis is the broker; results are not kept (tasks report through the
# database and metrics).
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Every task is periodic and idempotent, sent again by beat within its period, so
# a task taken off the queue and lost with its worker costs nothing; kombu's ack
# emulation (messages held in an "unacked" hash until acknowledged) is off. It
# killed the worker when Redis restarted: a connection lost while the worker
# held tasks not yet started closes the consumer's channel twice, and the
# second close restores the held tasks through a transport already let go
# (AttributeError, "Unrecoverable error"). With the worker gone, beat went
# with it, and the keepers that refill an emptied Redis never ran again
# (docs/operations.md, "Redis restarted without its data"). Without the
# emulation a task the restore cannot put back is logged and dropped.
CELERY_BROKER_TRANSPORT_OPTIONS = {"ack_emulation": False}
CELERY_BEAT_SCHEDULE = {
    "mark-stale": {"task": "inventory.tasks.mark_stale", "schedule": LLMGW_BEAT_PERIOD},
    "reconcile": {"task": "inventory.tasks.reconcile", "schedule": LLMGW_BEAT_PERIOD},
    "prune-events": {"task": "inventory.tasks.prune_events", "schedule": 3600.0},
    # A render not started within its period is superseded by the next one.
    "render-metrics": {
        "task": "nodes.tasks.render_metrics",
        "schedule": LLMGW_METRICS_RENDER_PERIOD,
        "options": {"expires": LLMGW_METRICS_RENDER_PERIOD},
    },
    # Done once a keeping period, or when Redis has lost what they keep (livestate.keeping): checked every
    # second (one SET NX), since until they run again a fleet beating into an emptied Redis reads the database.
    "keep-cards": {"task": "nodes.tasks.keep_cards", "schedule": 1.0, "options": {"expires": 1.0}},
    "keep-shard-lists": {"task": "inventory.tasks.keep_shard_lists", "schedule": 1.0, "options": {"expires": 1.0}},
    "refresh-fleet-load": {
        "task": "nodes.tasks.refresh_fleet_load",
        "schedule": LLMGW_FLEET_LOAD_PERIOD,
        "options": {"expires": LLMGW_FLEET_LOAD_PERIOD},
    },
}

# Security. Behind TLS in production (docs/operations.md); off in development
# so that http://127.0.0.1:8000 works.
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = 0 if DEBUG else env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^api/"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    # django-axes logs every login at INFO; its warnings (failures, lockouts) are what matter.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

# WhiteNoise serves the static files from the same web server that serves pages,
# so `make run` needs no separate web server for them.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
