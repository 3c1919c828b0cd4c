"""The heartbeat's scripts' KEYS and ARGV are built in the order the Lua scripts read them.

The beat script (livestate/beatscript.lua) and the writes of a heartbeat it did not apply
(livestate/recordscript.lua), each against the NamedTuples its caller builds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import livestate.beatscript
from livestate import shardversion
from livestate.beatscript import BeatArgs, BeatKeys
from livestate.heartbeats import RecordArgs, RecordKeys

SCRIPT = Path(livestate.beatscript.__file__).with_name("beatscript.lua").read_text()
RECORD_SCRIPT = Path(livestate.beatscript.__file__).with_name("recordscript.lua").read_text()


def names_read_from(table: str, script: str = SCRIPT) -> list[str]:
    """The local names the script assigns from KEYS[n] or ARGV[n], in the order of n (which must run 1, 2, …)."""
    found = {int(n): name for name, n in re.findall(rf"^local (\w+) = {table}\[(\d+)\]", script, re.MULTILINE)}
    assert sorted(found) == list(range(1, len(found) + 1)), f"{table} positions are not 1..{len(found)}"
    return [found[n] for n in sorted(found)]


def test_keys_are_built_in_the_order_the_script_reads_them():
    assert list(BeatKeys._fields) == names_read_from("KEYS")


def test_args_are_built_in_the_order_the_script_reads_them():
    assert list(BeatArgs._fields) == names_read_from("ARGV")


def test_the_script_reads_keys_and_args_only_through_those_names():
    """A KEYS[n] or ARGV[n] used elsewhere in the script would escape the two tests above."""
    uses = re.findall(r"(?:KEYS|ARGV)\[\d+\]", SCRIPT)
    assert len(uses) == len(BeatKeys._fields) + len(BeatArgs._fields)


def test_the_script_reads_the_counter_of_every_node_under_its_name():
    assert f"redis.call('HMGET', shard_versions_key, node_id, '{shardversion.EVERY_NODE}')" in SCRIPT


@pytest.mark.parametrize("table, built", [("KEYS", RecordKeys), ("ARGV", RecordArgs)])
def test_the_record_script_is_called_with_its_keys_and_args_in_the_order_it_reads_them(table, built):
    assert list(built._fields) == names_read_from(table, RECORD_SCRIPT)


def test_the_record_script_reads_its_fixed_keys_and_args_only_through_those_names():
    """Past its named ARGV come the self-metrics' increments, read by position from `first` on."""
    uses = re.findall(r"(?:KEYS|ARGV)\[\d+\]", RECORD_SCRIPT)
    assert len(uses) == len(RecordKeys._fields) + len(RecordArgs._fields)
    assert f"local first = {len(RecordArgs._fields) + 1}" in RECORD_SCRIPT
