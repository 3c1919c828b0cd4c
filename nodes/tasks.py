"""The web app's periodic work, run by Celery beat (llmgw_site/settings.py CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

import time

from celery import shared_task

from nodes import fleetload
from nodes.api import cards
from nodes.metrics import prerender


@shared_task
def render_metrics() -> int:
    """Render the fleet's part of /metrics ahead of the scrapes (nodes/metrics/prerender.py); its gzipped size."""
    return prerender.store(time.time())


@shared_task
def refresh_fleet_load() -> int:
    """Share the fleet's totals and sort figures ahead of the cluster pages (nodes/fleetload.py); nodes reporting."""
    return fleetload.refresh(time.time())[0].reporting


@shared_task
def keep_cards() -> int | None:
    """Store every node's card afresh once a period, or at once after Redis lost its data (livestate.cards.keep)."""
    return cards.keep_all()
