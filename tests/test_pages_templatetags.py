"""The pages' formatting helpers."""

import pytest

from inventory.models import STATE_COLOURS, NodeState
from nodes.templatetags.llmgw import age, bar_class, gib, state_badge


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "—"),
        (0, "0.0 GiB"),
        (2**29, "0.5 GiB"),
        (99.94 * 2**30, "99.9 GiB"),
        (300 * 2**30, "300 GiB"),
        (1024 * 2**30, "1.0 TiB"),
        (2**45, "32.0 TiB"),
    ],
)
def test_gib(value, shown):
    assert gib(value) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "never"),
        (-3, "0 s"),
        (59.9, "59 s"),
        (119, "119 s"),
        (120, "2 min"),
        (7199, "119 min"),
        (7200, "2 h"),
        (172_799, "47 h"),
        (172_800, "2 d"),
    ],
)
def test_age(seconds, shown):
    assert age(seconds) == shown


@pytest.mark.parametrize(("percent", "cls"), [(None, "p0"), (-5, "p0"), (42.4, "p42"), (42.6, "p43"), (250, "p100")])
def test_bar_class_is_whole_percent_within_bounds(percent, cls):
    assert bar_class(percent) == cls


@pytest.mark.parametrize("state", list(NodeState))
def test_state_badge_takes_its_colour_from_the_one_map(state):
    html = state_badge(state.value)
    assert (
        html
        == f'<span class="llmgw-badge llmgw-{STATE_COLOURS[state]}" data-state="{state.value}">{state.label}</span>\n'
    )
