"""The agent API against the longest, the over-long and the strangest strings, in every field.

Issue 22: the protocol allowed 256 characters for `arch` and `fstype` while their
columns held 64, and a GPU's class derived from a 256-character name went into 64:
on PostgreSQL such a registration answered 500 ("value too long") on every retry.
SQLite does not enforce lengths, so besides the status each stored value is held
to its column's length, and the suite runs on PostgreSQL in CI (.ci/run).

The bodies are built from the protocol's own types (msgspec.inspect), so a field
added to the protocol is covered without touching this file.
"""

from __future__ import annotations

import copy
import json
import re

import msgspec
import msgspec.inspect as mi
import pytest
from django.db import models

from agent import protocol
from inventory.models import GPU, Deployment, EngineInstall, FabricAttachment, Filesystem, Node, Weights
from tests.agentapi import JOIN_TOKEN, post

pytestmark = [pytest.mark.django_db]

# A right-to-left override, CJK, a character outside the BMP (two UTF-16 units, four
# UTF-8 bytes), a combining accent and a zero-width space: lengths count characters.
WIDE = "\u202e日本語\U0001d54fe\u0301\u200b"


def text(length: int, pattern: str | None) -> str:
    """A string of exactly `length` characters that `pattern` accepts."""
    value = (WIDE * length)[:length]
    if pattern is not None and not re.search(pattern, value):
        value = "a" * length
    assert pattern is None or re.search(pattern, value), pattern
    return value


def longest(kind: mi.Type):
    """The largest value of a protocol type: every string at its limit, every number at its bound."""
    if isinstance(kind, mi.StructType):
        return kind.cls(**{f.name: longest(f.type) for f in kind.fields})
    if isinstance(kind, mi.UnionType):
        return longest(next(t for t in kind.types if not isinstance(t, mi.NoneType)))
    if isinstance(kind, mi.StrType):
        assert kind.max_length is not None, kind
        return text(kind.max_length, kind.pattern)
    if isinstance(kind, mi.IntType | mi.FloatType):
        return kind.le
    if isinstance(kind, mi.BoolType):
        return True
    if isinstance(kind, mi.LiteralType):
        return kind.values[0]
    if isinstance(kind, mi.ListType):
        return [longest(kind.item_type) for _ in range(2)]
    if isinstance(kind, mi.DictType):
        return {longest(kind.key_type): longest(kind.value_type)}
    raise TypeError(f"no longest value for {kind}")


def longest_register(node_id: str) -> protocol.Register:
    registration = longest(mi.type_info(protocol.Register))
    registration.node_id = node_id
    return registration


def string_fields(kind: mi.Type, path: tuple = ()) -> list[tuple[tuple, mi.StrType]]:
    """(path, type) of every string field under a protocol type, lists and mappings at their first entry."""
    if isinstance(kind, mi.StructType):
        return [found for f in kind.fields for found in string_fields(f.type, (*path, f.name))]
    if isinstance(kind, mi.UnionType):
        return [found for t in kind.types for found in string_fields(t, path)]
    if isinstance(kind, mi.ListType):
        return string_fields(kind.item_type, (*path, 0))
    if isinstance(kind, mi.DictType):
        # The value under the one key `longest` made; keys are bounded like any string (test below).
        return string_fields(kind.value_type, (*path, None))
    if isinstance(kind, mi.StrType):
        return [(path, kind)]
    return []


def json_path(path: tuple, data) -> str:
    parts = []
    for part in path:
        if part is None:
            # msgspec names any value of a mapping so.
            parts.append("[...]")
            data = data[next(iter(data))]
            continue
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
        data = data[part]
    return "$" + "".join(parts)


def replaced(data, path: tuple, value):
    data = copy.deepcopy(data)
    target = data
    for part in path[:-1]:
        target = target[next(iter(target)) if part is None else part]
    last = path[-1]
    target[next(iter(target)) if last is None else last] = value
    return data


def columns_hold_their_values(node_id: str) -> list[str]:
    """Each stored string no longer than its column: what PostgreSQL enforces and SQLite does not."""
    too_long = []
    for model in (Node, GPU, Filesystem, Weights, FabricAttachment, EngineInstall):
        rows = Node.objects.filter(pk=node_id) if model is Node else model.objects.filter(node_id=node_id)
        for row in rows:
            for field in model._meta.fields:
                value = getattr(row, field.attname)
                if isinstance(field, models.CharField) and value and len(value) > field.max_length:
                    too_long.append(f"{model.__name__}.{field.name}: {len(value)} > {field.max_length}")
    return too_long


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


def register(client, registration: protocol.Register) -> str:
    response = post(client, "/api/v1/register", registration, JOIN_TOKEN)
    assert response.status_code == 200, response.content
    return protocol.decode(response.content, protocol.Registered).token


def test_the_longest_value_of_every_field_registers_and_beats(client):
    registration = longest_register("longest")

    token = register(client, registration)
    beat = longest(mi.type_info(protocol.Heartbeat))
    beat.inventory.hostname = "changed " + beat.inventory.hostname[8:]
    response = post(client, "/api/v1/heartbeat", beat, token)

    assert response.status_code == 200, response.content
    assert columns_hold_their_values("longest") == []
    node = Node.objects.get(pk="longest")
    # Stored whole, not cut: the columns are as long as the protocol's limits.
    assert (node.hostname, node.arch) == (beat.inventory.hostname, beat.inventory.host.arch)
    assert Filesystem.objects.get(node=node).fstype == beat.inventory.filesystems[0].fstype


def test_a_gpu_class_derived_from_the_longest_name_fits_its_column_and_a_deployment_can_ask_for_it(client):
    registration = longest_register("long-gpu")
    registration.inventory.gpus = [protocol.GPU(index=0, name="Q" * protocol.MAX_TEXT, memory_bytes=80 * 2**30)]

    register(client, registration)

    gpu = GPU.objects.get(node_id="long-gpu")
    limit = GPU._meta.get_field("gpu_class").max_length
    assert len(gpu.gpu_class) == limit
    # Cut from the name, never from the memory: the 40 and 80 GB cards stay apart.
    assert gpu.gpu_class.endswith("-80GB")
    assert Deployment._meta.get_field("gpu_class").max_length == limit


def test_every_string_field_one_character_too_long_is_refused_naming_it(client):
    token = register(client, longest_register("over"))
    base = msgspec.to_builtins(longest(mi.type_info(protocol.Heartbeat)))
    fields = string_fields(mi.type_info(protocol.Heartbeat))
    assert len(fields) > 25
    wrong = []
    for path, kind in fields:
        body = replaced(base, path, text(kind.max_length + 1, kind.pattern))
        response = post(client, "/api/v1/heartbeat", json.dumps(body).encode(), token)
        field = json_path(path, base)
        if response.status_code != 400 or protocol.decode(response.content, protocol.Rejection).field != field:
            wrong.append(f"{field}: {response.status_code} {response.content[:200]!r}")
    assert wrong == []


@pytest.mark.parametrize("where", ["labels", "engine_versions"])
def test_an_over_long_mapping_key_is_refused(client, where):
    token = register(client, longest_register("keys"))
    base = msgspec.to_builtins(longest(mi.type_info(protocol.Heartbeat)))
    base["inventory"][where] = {"k" * (protocol.MAX_TEXT + 1): "v"}

    response = post(client, "/api/v1/heartbeat", json.dumps(base).encode(), token)

    assert response.status_code == 400, response.content
    assert protocol.decode(response.content, protocol.Rejection).field == f"$.inventory.{where}"


def test_a_nul_in_any_string_field_is_refused_and_nothing_is_stored(client):
    token = register(client, longest_register("nul"))
    base = msgspec.to_builtins(longest(mi.type_info(protocol.Heartbeat)))
    stored = Node.objects.get(pk="nul").hostname
    wrong = []
    for path, _ in string_fields(mi.type_info(protocol.Heartbeat)):
        body = replaced(base, path, "a\x00b")
        response = post(client, "/api/v1/heartbeat", json.dumps(body).encode(), token)
        if response.status_code != 400:
            wrong.append(f"{json_path(path, base)}: {response.status_code}")
    assert wrong == []
    assert Node.objects.get(pk="nul").hostname == stored


def test_a_nul_in_a_registration_is_refused(client):
    body = msgspec.to_builtins(longest_register("nul-reg"))
    body["inventory"]["host"]["arch"] = "x86\x00_64"

    response = post(client, "/api/v1/register", json.dumps(body).encode(), JOIN_TOKEN)

    assert response.status_code == 400, response.content
    assert not Node.objects.filter(pk="nul-reg").exists()
