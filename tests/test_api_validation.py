"""Every limit of a heartbeat gives its documented 4xx, names the field, and stores nothing."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import protocol
from livestate import keys, loadstore
from tests.agentapi import JOIN_TOKEN, a_load, database_snapshot, post, register
from tests.factories import make_inventory

pytestmark = [pytest.mark.django_db]

HTML = "<script>alert('x')</script>"


@pytest.fixture(autouse=True)
def _join_token(settings, redis_client):
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN


@pytest.fixture
def token(client):
    return register(client, "gpu-1", gpus=2)


def full_heartbeat() -> dict:
    """A valid heartbeat carrying every part, as plain JSON data."""
    inventory = make_inventory(
        "gpu-1.example",
        gpus=2,
        labels={"rack": "r7"},
        engine_versions={"vllm": "0.9"},
        engines_probed=True,
        provision=[protocol.EngineInstall(engine="vllm", version="0.9")],
        filesystems=[protocol.Filesystem(mount="/models", fstype="ext4", total_bytes=10**12, free_bytes=10**11)],
        weights=[protocol.Weights(path="/models/llama", size_bytes=10**10, format="safetensors")],
        weights_scanned=True,
        fabrics=[protocol.Fabric(name="ib-a", hcas=["mlx5_0"], rate_gbps=400)],
    )
    beat = protocol.Heartbeat(
        inventory_hash="hash-2",
        inventory=inventory,
        load=a_load(),
        shards=[protocol.ShardStatus(shard="shard-a", state="running", pid=42, metrics_port=9000, detail="ok")],
        sent_at=1.7e9,
    )
    return msgspec.to_builtins(beat)


# The longest list each list field may be (protocol.py).
LIST_LIMITS = {
    "$.inventory.gpus": protocol.MAX_GPUS,
    "$.inventory.filesystems": protocol.MAX_FILESYSTEMS,
    "$.inventory.weights": protocol.MAX_WEIGHTS,
    "$.inventory.fabrics": protocol.MAX_FABRICS,
    "$.inventory.fabrics[0].hcas": protocol.MAX_HCAS,
    "$.inventory.provision": protocol.MAX_ENGINES,
    "$.load.shards": protocol.MAX_SHARDS,
    "$.shards": protocol.MAX_SHARDS,
}


def json_path(path: tuple) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def leaves(data, path=()) -> list[tuple[tuple, object]]:
    """(path, value) of every scalar in the data; mappings of free keys are skipped."""
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in leaves(value, (*path, key))]
    if isinstance(data, list):
        return [leaf for index, value in enumerate(data) for leaf in leaves(value, (*path, index))]
    return [(path, data)]


def set_at(data, path: tuple, value):
    data = copy.deepcopy(data)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return data


def get_at(data, path: tuple):
    for part in path:
        data = data[part]
    return data


BASE = full_heartbeat()
# Free-form mappings (labels, engine versions): any string value is valid there.
LEAVES = [(path, value) for path, value in leaves(BASE) if path[-2:-1] not in (("labels",), ("engine_versions",))]


def assert_rejected(response, status: int, field: str) -> None:
    assert response.status_code == status, response.content
    rejection = protocol.decode(response.content, protocol.Rejection)
    assert rejection.field == field, rejection
    assert rejection.reason


def assert_nothing_stored(redis_client, before) -> None:
    assert database_snapshot() == before
    assert loadstore.fetch(["gpu-1"]) == {}
    assert not redis_client.hexists(keys.HEARTBEATS, "gpu-1")


def the_valid_heartbeat_is_accepted(client, token):
    response = post(client, "/api/v1/heartbeat", json.dumps(BASE).encode(), token)
    assert response.status_code == 200, response.content


def test_the_full_heartbeat_used_below_is_valid(client, token):
    the_valid_heartbeat_is_accepted(client, token)


def over(path: str, extra: int = 1) -> tuple[tuple, list]:
    parts = tuple(int(p) if p.isdigit() else p for p in path[2:].replace("[", ".").replace("]", "").split("."))
    element = get_at(BASE, parts)[0]
    return parts, [element] * (LIST_LIMITS[path] + extra)


CASES = {
    "cpu above 100 %": (("load", "cpu_percent"), 100.01, "$.load.cpu_percent"),
    "negative cpu": (("load", "cpu_percent"), -0.5, "$.load.cpu_percent"),
    "negative count": (("load", "cpus"), -1, "$.load.cpus"),
    "fractional count": (("load", "cpus"), 1.5, "$.load.cpus"),
    "string for a number": (("load", "load1"), "1.0", "$.load.load1"),
    "bool for a number": (("load", "memory_used_bytes"), True, "$.load.memory_used_bytes"),
    "bytes past 2**53": (("load", "memory_used_bytes"), 2**53 + 1, "$.load.memory_used_bytes"),
    "huge float": (("load", "load5"), 1e300, "$.load.load5"),
    "negative time": (("sent_at",), -1.0, "$.sent_at"),
    "long text": (("inventory", "hostname"), "h" * (protocol.MAX_TEXT + 1), "$.inventory.hostname"),
    "long detail": (("shards", 0, "detail"), "d" * (protocol.MAX_DETAIL + 1), "$.shards[0].detail"),
    "HTML shard id": (("shards", 0, "shard"), HTML, "$.shards[0].shard"),
    "unknown shard state": (("shards", 0, "state"), "dancing", "$.shards[0].state"),
    "GPU index past the limit": (("inventory", "gpus", 0, "index"), protocol.MAX_GPUS, "$.inventory.gpus[0].index"),
    "HTML label key": (("inventory", "labels"), {HTML: "x"}, "$.inventory.labels"),
    "too many labels": (
        ("inventory", "labels"),
        {f"k{i}": "v" for i in range(protocol.MAX_LABELS + 1)},
        "$.inventory.labels",
    ),
    "object for a list": (("shards",), {"shard": "a"}, "$.shards"),
    "null for a string": (("inventory_hash",), None, "$.inventory_hash"),
    **{f"too long {path}": (*over(path), path) for path in LIST_LIMITS},
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_field_limit_is_refused_naming_the_field(client, token, redis_client, case):
    path, value, field = CASES[case]
    before = database_snapshot()

    response = post(client, "/api/v1/heartbeat", json.dumps(set_at(BASE, path, value)).encode(), token)

    assert_rejected(response, 400, field)
    assert_nothing_stored(redis_client, before)


BODIES = {
    "NaN": (json.dumps(BASE).replace('"cpu_percent": 12.5', '"cpu_percent": NaN').encode(), 400, "$"),
    "Infinity": (json.dumps(BASE).replace('"sent_at": 1700000000.0', '"sent_at": Infinity').encode(), 400, "$"),
    "truncated": (json.dumps(BASE).encode()[:-3], 400, "$"),
    "not an object": (b"[1, 2, 3]", 400, "$"),
    "bad UTF-8": (json.dumps(BASE).replace("gpu-1.example", "gpu-\udcff").encode("utf-8", "surrogateescape"), 400, "$"),
    "deep nesting": (b'{"future": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, 400, "$"),
    "deep arrays": (b'{"future": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "$"),
    "NUL in a string": (json.dumps(BASE).replace("gpu-1.example", "gpu-1\\u0000").encode(), 400, "$"),
    "too large": (
        json.dumps({**BASE, "padding": "x" * protocol.MAX_BODY_BYTES}).encode(),
        413,
        "$",
    ),
}


@pytest.mark.parametrize("case", list(BODIES))
def test_malformed_bodies_are_refused(client, token, redis_client, case):
    body, status, field = BODIES[case]
    before = database_snapshot()

    response = post(client, "/api/v1/heartbeat", body, token)

    assert_rejected(response, status, field)
    assert_nothing_stored(redis_client, before)


def test_a_body_at_the_limit_is_accepted(client, token):
    body = json.dumps({**BASE, "padding": ""}).encode()
    body = json.dumps({**BASE, "padding": "x" * (protocol.MAX_BODY_BYTES - len(body))}).encode()
    assert len(body) == protocol.MAX_BODY_BYTES
    assert post(client, "/api/v1/heartbeat", body, token).status_code == 200


def test_other_content_types_methods_and_missing_tokens_are_refused(client, token, redis_client):
    before = database_snapshot()
    body = json.dumps(BASE).encode()

    assert_rejected(post(client, "/api/v1/heartbeat", body, token, content_type="text/plain"), 415, "Content-Type")
    assert_rejected(post(client, "/api/v1/heartbeat", body, None), 401, "Authorization")
    assert_rejected(post(client, "/api/v1/heartbeat", body, "gpu-1"), 401, "Authorization")
    assert_rejected(post(client, "/api/v1/heartbeat", body, "../x.secret"), 401, "Authorization")
    assert_rejected(client.get("/api/v1/heartbeat", headers={"Authorization": f"Bearer {token}"}), 405, "method")
    assert_nothing_stored(redis_client, before)


def test_unknown_fields_are_ignored(client, token):
    body = json.dumps({**BASE, "gpu_temperatures": [71, 69], "load": {**BASE["load"], "psi": {"cpu": 0.1}}})
    assert post(client, "/api/v1/heartbeat", body.encode(), token).status_code == 200


# -- generated: at least 2,000 malformed heartbeats --------------------------------------------------------------

too_big = st.one_of(
    st.integers(min_value=protocol.MAX_COUNT + 1, max_value=10**30), st.floats(min_value=1e12, max_value=1e300)
)
negative = st.one_of(st.integers(max_value=-1, min_value=-(10**30)), st.floats(max_value=-1e-9, min_value=-1e300))
# NUL is refused before anything else (PostgreSQL cannot store it) and a lone surrogate makes the JSON
# itself malformed: both are kept out where a field is to be at fault, and tested on their own.
any_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20)
text_with_html = any_text.map(lambda s: HTML + s)
overlong = st.integers(min_value=protocol.MAX_DETAIL + 1, max_value=3000).map(lambda n: ("<b>" * n)[:n])
not_a_string = st.one_of(
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(), st.just([]), st.just({})
)
not_a_number = st.one_of(text_with_html, st.booleans(), st.none(), st.just([1]), st.just({"n": 1}))


def wrong_value(value):
    """Values that are invalid wherever a value like this one stands."""
    if isinstance(value, bool):
        return st.one_of(st.integers(), any_text, st.none())
    if isinstance(value, int | float):
        return st.one_of(too_big, negative, not_a_number)
    return st.one_of(not_a_string, overlong)


@st.composite
def malformed_heartbeat(draw) -> tuple[bytes, str]:
    """A body with exactly one thing wrong, and the field the rejection must name."""
    kind = draw(
        st.sampled_from(["leaf", "leaf", "leaf", "list", "html id", "syntax", "utf8", "surrogate", "nul", "nesting"])
    )
    if kind == "leaf":
        path, value = draw(st.sampled_from(LEAVES))
        return json.dumps(set_at(BASE, path, draw(wrong_value(value)))).encode(), json_path(path)
    if kind == "list":
        path = draw(st.sampled_from(sorted(LIST_LIMITS)))
        parts, items = over(path, draw(st.integers(min_value=1, max_value=40)))
        return json.dumps(set_at(BASE, parts, items)).encode(), path
    if kind == "html id":
        where = draw(st.sampled_from([("shards", 0, "shard"), ("load", "shards", 0, "shard")]))
        return json.dumps(set_at(BASE, where, draw(text_with_html))).encode(), json_path(where)
    body = json.dumps(BASE).encode()
    if kind == "syntax":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"nul", b"'x'", b"0x10", b"1.e"]))
        return body.replace(b'"cpu_percent": 12.5', b'"cpu_percent": ' + literal), "$"
    if kind == "nul":
        path, value = draw(st.sampled_from([leaf for leaf in LEAVES if isinstance(leaf[1], str)]))
        return json.dumps(set_at(BASE, path, value + "\x00" + draw(any_text))).encode(), "$"
    if kind == "surrogate":
        return body.replace(b"gpu-1.example", b"gpu-1\\ud800"), "$"
    if kind == "utf8":
        junk = draw(st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)))
        return body.replace(b"gpu-1.example", b"gpu-" + junk), "$"
    depth = draw(st.integers(min_value=1100, max_value=20000))
    opener, closer = draw(st.sampled_from([(b'{"a":', b"}"), (b"[", b"]")]))
    return b'{"future": ' + opener * depth + b"1" + closer * depth + b"}", "$"


def _is_utf8(data: bytes) -> bool:
    # Junk that decodes is not what this case is about: a backslash and an "r", say, is a valid JSON escape.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_2000_generated_malformed_heartbeats_are_refused_naming_the_field_and_store_nothing(
    client, token, redis_client
):
    before = database_snapshot()
    posted = []

    @settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=malformed_heartbeat())
    def post_one(case):
        body, field = case
        assert_rejected(post(client, "/api/v1/heartbeat", body, token), 400, field)
        posted.append(field)

    post_one()
    assert len(posted) >= 2000
    assert_nothing_stored(redis_client, before)
