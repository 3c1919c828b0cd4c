"""State choices are labelled by their stored value, as the admin and the API have always shown them."""

from __future__ import annotations

import pytest

from inventory.models import AdminState, GPUCondition, Liveness, NodeState, ReplicaState


@pytest.mark.parametrize("choices", [AdminState, Liveness, NodeState, ReplicaState, GPUCondition])
def test_a_state_is_shown_as_it_is_stored(choices):
    assert choices.choices == [(value, value) for value in choices.values]
    assert [member.label for member in choices] == choices.values


def test_a_state_is_still_its_stored_string():
    assert NodeState("cordoned") is NodeState.CORDONED
    assert NodeState.CORDONED == "cordoned"
    assert str(NodeState.CORDONED) == "cordoned"
