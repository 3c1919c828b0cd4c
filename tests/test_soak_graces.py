"""The soak's account of the control plane's grace periods (bench/soaklib/graces.py)."""

from __future__ import annotations

from bench.soaklib.graces import Graces


def test_a_grace_begins_its_length_before_it_ends_and_extensions_merge():
    graces = Graces(length=6)
    graces.saw(100.5, 106)  # declared at 100, seen half a second later
    graces.saw(103, 109)  # extended by a later sweep
    graces.saw(120, 110)  # long over: nothing running
    graces.saw(130, 136)
    assert graces.stretches == [[100, 109], [130, 136]]
    assert graces.summary(t0=100) == {"periods_s": [[0, 9], [30, 36]], "seconds": 15}


def test_ungraced_is_the_window_less_the_grace_periods():
    graces = Graces(length=6, stretches=[[100, 109], [130, 136]])
    assert graces.ungraced(90, 150) == [(90, 100), (109, 130), (136, 150)]
    assert graces.ungraced(101, 108) == []
    assert graces.ungraced(50, 60) == [(50, 60)]


def test_a_threshold_counts_as_crossed_only_with_a_free_stretch_after_it():
    margin = 7
    no_grace = Graces(length=6)
    # Quiet from 100: unreachable (6 s) surely swept by 113, not by 112.
    assert no_grace.surely_crossed(100, 113, 6, margin)
    assert not no_grace.surely_crossed(100, 112, 6, margin)
    # A grace period from 104 to 110 leaves 110–113 free: too short a stretch.
    graced = Graces(length=6, stretches=[[104, 110]])
    assert not graced.surely_crossed(100, 113, 6, margin)
    assert graced.surely_crossed(100, 117, 6, margin)
    # One before the threshold changes nothing.
    early = Graces(length=6, stretches=[[95, 101]])
    assert early.surely_crossed(100, 113, 6, margin)
