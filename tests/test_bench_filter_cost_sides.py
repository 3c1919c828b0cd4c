"""bench.filter_cost's sides: "straight" is the shipped config with its streams sent past the stream relay."""

from __future__ import annotations

from bench import tenants
from gateway.haproxy_config import Paths

RELAYED = "use-service lua.llmgw_relay"


def test_the_shipped_side_relays_its_streams_and_the_straight_side_does_not(tmp_path):
    engines = {"fixed": 1, "stream": 2}
    (tmp_path / "on").mkdir()
    (tmp_path / "straight").mkdir()
    tenants.configure(tmp_path / "on", engines, "on")
    tenants.configure(tmp_path / "straight", engines, "on", relay=False)
    shipped = Paths(tmp_path / "on").config.read_text()
    straight = Paths(tmp_path / "straight").config.read_text()
    assert RELAYED in shipped
    assert RELAYED not in straight
    # Everything else the side measures is as shipped: the usage filter and the tenants' limits.
    for line in ("filter lua.llmgw_usage", "track-sc0"):
        assert line in shipped and line in straight, line
