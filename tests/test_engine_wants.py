"""The control plane's half of provisioning: which engines a node is asked for, and what it reported."""

from __future__ import annotations

from agent import protocol
from inventory.engine_wants import wants
from inventory.models import Deployment, Engine, Replica, Shard


def shard_of(engine: str, gpus: int) -> Shard:
    # wants() reads only each shard's deployment: unsaved rows are enough.
    return Shard(replica=Replica(deployment=Deployment(engine=engine, model_source="/m", gpus_per_shard=gpus)))


def test_a_node_is_asked_for_the_engines_of_its_shards_once_each_with_the_variant_its_profile_needs():
    shards = [
        shard_of(Engine.LLAMA_CPP, 1),
        shard_of(Engine.LLAMA_CPP, 1),
        shard_of(Engine.LLAMA_CPP, 0),
        shard_of(Engine.SGLANG, 2),
        shard_of(Engine.DEMO, 0),
        shard_of(Engine.COMMAND, 0),
    ]
    assert wants(shards) == [
        protocol.EngineWant(engine="llama.cpp", variant="cpu"),
        protocol.EngineWant(engine="llama.cpp", variant="cuda"),
        protocol.EngineWant(engine="sglang", variant="cuda"),
    ]
    assert wants([]) == []


def test_a_shard_list_cached_without_engines_is_read_again_not_taken_as_wanting_none():
    import msgspec

    from livestate import shardlists

    old = msgspec.msgpack.encode([[1, 2], [], []])
    assert shardlists.decode(old, (1, 2)) is None
    new = msgspec.msgpack.encode(shardlists.CachedShards((1, 2), [], [], [protocol.EngineWant(engine="vllm")]))
    assert shardlists.decode(new, (1, 2)).engines == [protocol.EngineWant(engine="vllm")]
