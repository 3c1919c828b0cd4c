"""The wire format between agents and the control plane, defined once.

Both sides import these types: the agent encodes them, the control plane decodes
requests with them, so a field cannot mean one thing on one side and another on
the other. Every bound below is part of the contract: the control plane rejects
a body that breaks one with a 4xx naming the field, and an agent never builds
such a body. Unknown fields are ignored on decoding so that a newer agent still
talks to an older control plane.

This module imports nothing but msgspec: the agent must not pull in Django.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, overload

import msgspec

PROTOCOL_VERSION = 1
T = TypeVar("T")

# Bounds. Generous for real machines, small enough that one body cannot make
# the control plane allocate without limit.
MAX_BODY_BYTES = 512 * 1024
MAX_ID = 128
MAX_TEXT = 256
MAX_DETAIL = 1024
MAX_GPUS = 64
MAX_FILESYSTEMS = 64
MAX_WEIGHTS = 1024
MAX_SHARDS = 64
MAX_LABELS = 64
MAX_FABRICS = 16
MAX_HCAS = 32
MAX_ENGINES = 32
MAX_ARGS = 128
# XIDs per GPU per heartbeat: enough to tell a sick GPU, bounded against a storm.
MAX_XIDS = 16
# 2**53: above this a float no longer holds every integer, and no real byte
# count or counter comes close.
MAX_COUNT = 2**53

# Every pattern ends in \Z, not $: msgspec searches with `re`, where $ also matches
# before a final newline, so "victim-1\n" would pass as an id (issue 17).
NodeId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z")]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
BootId = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
SequenceNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Detail = Annotated[str, msgspec.Meta(max_length=MAX_DETAIL)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-/]*\Z")]
Labels = Annotated[dict[LabelKey, Text], msgspec.Meta(max_length=MAX_LABELS)]
GPUIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS - 1)]
# NVML's UUIDs ("GPU-…", "MIG-…"). Only these characters: the uuid becomes a /metrics
# label, stored between separator bytes (livestate.loadlines). \Z, not $: "$" would let a newline through.
GPUUuid = Annotated[str, msgspec.Meta(max_length=MAX_TEXT, pattern=r"^[A-Za-z0-9._:/-]*\Z")]
# NVML's XID codes are small integers; the bound only keeps a body sane.
Xid = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]


class Struct(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    """Base for every message: unknown fields are ignored, defaults not sent."""


class Host(Struct):
    """The operating system and processor, as the agent reads them."""

    os: Text = ""
    os_version: Text = ""
    kernel: Text = ""
    arch: Text = ""
    cpu_model: Text = ""
    cpus: Count = 0


class GPU(Struct):
    """One accelerator. `health` is "ok", or why it must not be used."""

    index: GPUIndex
    uuid: Text = ""
    name: Text = ""
    memory_bytes: Bytes = 0
    ecc_errors: Count = 0
    health: Detail = "ok"


class GPULoad(Struct):
    """One GPU as the agent sampled it through NVML, and the error evidence it saw (docs/gpus.md).

    A figure the board cannot give (power on some cards) is None and not sent.
    """

    index: GPUIndex
    uuid: GPUUuid = ""
    utilization_percent: Percent | None = None
    memory_used_bytes: Bytes | None = None
    temperature_celsius: Annotated[float, msgspec.Meta(ge=-273, le=1000)] | None = None
    power_watts: Annotated[float, msgspec.Meta(ge=0, le=1e6)] | None = None
    # XID events since the last heartbeat the control plane answered: kept by the
    # agent until a heartbeat carrying them is answered, so a failed beat loses none.
    xids: Annotated[list[Xid], msgspec.Meta(max_length=MAX_XIDS)] = []
    # Levels, as NVML reads them now: uncorrectable ECC errors since the driver
    # loaded (volatile), pages waiting to be retired, rows waiting to be remapped
    # at the next GPU reset, and a remapping that failed.
    ecc_uncorrected: Count = 0
    retired_pages_pending: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    # Consecutive samples, ending with this one, with no XID and none of the levels
    # above: what lets the control plane clear a degraded GPU without flapping.
    clean_samples: Count = 0


class Filesystem(Struct):
    """A filesystem holding model directories, reported once per filesystem."""

    mount: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DETAIL)]
    fstype: Text = ""
    total_bytes: Bytes = 0
    free_bytes: Bytes = 0
    shared: bool = False


WeightsFormat = Literal["safetensors", "bin", "gguf", "other"]


class Weights(Struct):
    """Model files the node can see: a model directory or a single GGUF file."""

    path: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DETAIL)]
    size_bytes: Bytes = 0
    format: WeightsFormat = "other"


class Fabric(Struct):
    """The node's attachment to one operator-named fabric."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]
    hcas: Annotated[list[Text], msgspec.Meta(max_length=MAX_HCAS)] = []
    rate_gbps: Count = 0


InstallState = Literal["installing", "ready", "failed", "unsupported"]


class EngineInstall(Struct):
    """Where installing one engine stands on the node."""

    engine: Text
    version: Text = ""
    variant: Text = ""
    state: InstallState = "ready"
    detail: Detail = ""


class Inventory(Struct):
    """Everything the node is. Sent only when it changed or when asked for."""

    hostname: Text = ""
    mgmt_addr: Text = ""
    labels: Labels = {}
    memory_total_bytes: Bytes = 0
    host: Host = msgspec.field(default_factory=Host)
    agent_version: Text = ""
    engine_versions: Annotated[dict[Text, Text], msgspec.Meta(max_length=MAX_ENGINES)] = {}
    engines_probed: bool = False
    provision: Annotated[list[EngineInstall], msgspec.Meta(max_length=MAX_ENGINES)] = []
    gpus: Annotated[list[GPU], msgspec.Meta(max_length=MAX_GPUS)] = []
    filesystems: Annotated[list[Filesystem], msgspec.Meta(max_length=MAX_FILESYSTEMS)] = []
    weights: Annotated[list[Weights], msgspec.Meta(max_length=MAX_WEIGHTS)] = []
    # False: no model directory was configured, so the node never looked and an
    # empty list says nothing; True with an empty list: it looked and has none.
    weights_scanned: bool = False
    fabrics: Annotated[list[Fabric], msgspec.Meta(max_length=MAX_FABRICS)] = []


class ShardLoad(Struct):
    """One engine's use of the node: cores busy and resident memory."""

    shard: NodeId
    cpu_cores: Fraction = 0.0
    rss_bytes: Bytes = 0


class Load(Struct):
    """How busy the node was over the interval before this heartbeat."""

    cpu_percent: Percent
    cpus: Count
    load1: Fraction = 0.0
    load5: Fraction = 0.0
    load15: Fraction = 0.0
    memory_used_bytes: Bytes = 0
    memory_available_bytes: Bytes = 0
    interval_seconds: Fraction = 0.0
    shards: Annotated[list[ShardLoad], msgspec.Meta(max_length=MAX_SHARDS)] = []
    # Empty from agents that predate GPU sampling, and on nodes without NVML.
    gpus: Annotated[list[GPULoad], msgspec.Meta(max_length=MAX_GPUS)] = []


ShardState = Literal["starting", "running", "exited", "restarting", "stopped", "failed"]


class ShardStatus(Struct):
    """What the agent's runner knows of one shard it runs."""

    shard: NodeId
    state: ShardState
    pid: Count = 0
    exit_code: Annotated[int, msgspec.Meta(ge=-255, le=255)] | None = None
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    restarts: Count = 0
    detail: Detail = ""


class Heartbeat(Struct):
    """POST /api/v1/heartbeat. The node is named by the token, never the body."""

    inventory_hash: Text = ""
    inventory: Inventory | None = None
    load: Load | None = None
    shards: Annotated[list[ShardStatus], msgspec.Meta(max_length=MAX_SHARDS)] = []
    # The agent's own clock, for the operator's curiosity only: every age is
    # measured on the control plane's clock.
    sent_at: Timestamp = 0.0
    # Which run of the agent sent this (random, new at each start) and its number
    # within that run, from 1. A heartbeat no newer than one already received from
    # the same run is refused (409, `$.seq`) and changes nothing. Empty and 0, as
    # agents before these fields send, mean: no order is claimed.
    boot_id: BootId = ""
    seq: SequenceNumber = 0


class Register(Struct):
    """POST /api/v1/register, with the join token as the bearer."""

    node_id: NodeId
    inventory: Inventory = msgspec.field(default_factory=Inventory)
    inventory_hash: Text = ""


class Registered(Struct, omit_defaults=False):
    """The answer to a registration: the node token, shown this once."""

    node_id: str
    token: str
    heartbeat_interval: float


class ShardSpec(Struct, omit_defaults=False):
    """A shard the control plane wants this node to run."""

    shard: str
    replica: str
    model: str
    engine: str
    command: list[str]
    env: dict[str, str] = {}
    port: int = 0


class EngineWant(Struct, omit_defaults=False):
    """An engine the control plane wants installed on this node; empty version and variant: llmgw's defaults."""

    engine: str
    version: str = ""
    variant: str = ""


class HeartbeatReply(Struct, omit_defaults=False):
    """The answer to a heartbeat."""

    state: str
    heartbeat_interval: float
    inventory_wanted: bool
    shards: list[ShardSpec] | None = None
    # None: the control plane does not manage engines (an older one); a list: exactly these.
    engines: list[EngineWant] | None = None


class Rejection(Struct, omit_defaults=False):
    """Every 4xx from the agent API: which field, and why."""

    field: str
    reason: str


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """Foreign text (a program's output, a log) made fit for a string field: at most `limit` long, and
    without NUL, which the control plane refuses in any string (PostgreSQL cannot store it)."""
    return text.replace("\x00", "")[:limit]


encoder = msgspec.json.Encoder()


def encode(message: Struct) -> bytes:
    return encoder.encode(message)


@overload
def decode(body: bytes, kind: type[T]) -> T: ...
@overload
def decode(body: bytes, kind: Any) -> Any: ...  # a constrained alias, such as Labels
def decode(body: bytes, kind: Any) -> Any:
    """Decode and validate; raises msgspec.ValidationError or DecodeError."""
    return msgspec.json.decode(body, type=kind)
