"""Template helpers for the operator pages: sizes, ages, bars and the state badge."""

from __future__ import annotations

from functools import lru_cache

from django import template
from django.template.loader import render_to_string
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from inventory.models import STATE_COLOURS, NodeState

register = template.Library()


@register.filter
def gib(value: int | float | None) -> str:
    """Bytes as GiB (TiB past 1024 GiB), one decimal below 100; "—" when unknown."""
    if value is None:
        return "—"
    gibibytes = value / 2**30
    if gibibytes >= 1024:
        return f"{gibibytes / 1024:.1f} TiB"
    return f"{gibibytes:.0f} GiB" if gibibytes >= 100 else f"{gibibytes:.1f} GiB"


@register.filter
def age(seconds: float | None) -> str:
    """A duration as the page shows it: 4 s, 3 min, 2 h, 5 d."""
    if seconds is None:
        return "never"
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


@register.filter
def bar_class(percent: float | None) -> str:
    """The CSS class that sets a bar's width, in whole percent.

    A class rather than a style attribute, so the pages work under a content
    security policy that forbids inline styles.
    """
    if percent is None:
        return "p0"
    return f"p{min(max(round(percent), 0), 100)}"


@register.simple_tag
def state_badge(state: str) -> str:
    """The badge of a displayed state, from the one badge partial, colour from STATE_COLOURS."""
    return _badge(NodeState(state).value)


@lru_cache(maxsize=len(NodeState))
def _badge(value: str) -> str:
    # A badge depends on its state alone, and a table shows a hundred: render each state once.
    state = NodeState(value)
    return render_to_string("partials/state_badge.html", {"state": state, "colour": STATE_COLOURS[state]})


@register.filter
def thousands(value: int | float | None) -> str:
    """A count with thousands separated (1,234,567), as the docs write them; "—" when unknown."""
    if value is None:
        return "—"
    return f"{value:,.0f}"


@register.simple_tag
def limit(value: int | None) -> SafeString:
    """A tenant's limit as the tenant pages show it: "no limit" when empty, and what a limit of 0 means."""
    if value is None:
        return mark_safe('<span class="muted">no limit</span>')
    if value == 0:
        return mark_safe('<span class="bad">0: every request refused</span>')
    return format_html('<span class="num">{}</span>', thousands(value))
