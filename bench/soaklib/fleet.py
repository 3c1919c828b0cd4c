"""A simulated fleet for the soak: thousands of nodes speaking the real protocol from one asyncio loop.

Each node has a realistic inventory (GPUs of a few machine classes, local and
shared filesystems, model weights, fabrics, engines), a load that wanders, and
the shards the control plane told it to run. It registers with the join token,
then beats every interval with `agent.protocol` types, exactly as the agent
does: the inventory only when it changed or was asked for.

Every request is recorded (when, how long, what came back) so the soak can
compute error rates outside its injected outages, and every node remembers the
inventory the control plane last acknowledged and when a load may last have
been stored, which is what the soak's end checks compare against.

The HTTP client is a few lines over asyncio streams (HTTP/1.0, one connection
per request, as an agent whose connection the proxy closed would open a new
one): no package beyond the agent's own, and cheap enough that 2,000 nodes cost
the machine little.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field

import msgspec

from agent import protocol
from agent.discovery import inventory_hash

GiB = 2**30
TiB = 2**40

# Machine classes seen in real fleets: (name, GPU name, GPUs, GPU memory, host memory, CPUs, share of fleet).
MACHINES = (
    ("h100x8", "NVIDIA H100 80GB HBM3", 8, 80 * GiB, 2048 * GiB, 224, 0.35),
    ("a100x8", "NVIDIA A100-SXM4-40GB", 8, 40 * GiB, 1024 * GiB, 128, 0.25),
    ("l40sx4", "NVIDIA L40S", 4, 48 * GiB, 512 * GiB, 64, 0.2),
    ("cpu", "", 0, 0, 256 * GiB, 96, 0.2),
)
MODELS: tuple[tuple[str, int, protocol.WeightsFormat], ...] = (
    ("/models/Meta-Llama-3-8B-Instruct", 16 * GiB, "safetensors"),
    ("/models/Meta-Llama-3-70B-Instruct", 140 * GiB, "safetensors"),
    ("/models/Mixtral-8x7B-Instruct-v0.1", 93 * GiB, "safetensors"),
    ("/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf", 4 * GiB, "gguf"),
    ("/filer/models/Llama-3.1-405B-Instruct-FP8", 410 * GiB, "safetensors"),
)
ENGINES = {"vllm": "0.6.3.post1", "llama.cpp": "b4024", "sglang": "0.3.5"}


class Request(msgspec.Struct, array_like=True):
    """One request as the fleet saw it: start (wall clock), seconds taken, outcome."""

    at: float
    seconds: float
    kind: str  # "heartbeat" | "register"
    status: int  # HTTP status, or 0 when no answer came
    error: str = ""


@dataclass
class SimNode:
    node_id: str
    inventory: protocol.Inventory
    skew: float = 0.0  # seconds added to sent_at: the node's clock is wrong
    token: str | None = None
    silent: bool = False
    acknowledged_hash: str = ""
    inventory_wanted: bool = False
    # Shards the control plane wants here, and their pretend processes' start.
    shards: dict[str, protocol.ShardSpec] = field(default_factory=dict)
    # Wall-clock end of the last request that may have stored a load (answered 200,
    # or sent and not answered), and whether one is under way: the control plane
    # cannot hold a load newer than that, which is what the /metrics check needs.
    stored_until: float = 0.0
    inflight: bool = False
    last_ok_at: float = 0.0
    cpu: float = 20.0
    rng: random.Random = field(default_factory=random.Random)

    @property
    def digest(self) -> str:
        return inventory_hash(self.inventory)

    def load(self) -> protocol.Load:
        inv = self.inventory
        self.cpu = min(max(self.cpu + self.rng.uniform(-5, 5), 0.0), 100.0)
        total = inv.memory_total_bytes
        used = int(total * min(0.1 + self.cpu / 150, 0.95))
        cpus = inv.host.cpus
        shard_loads = [
            protocol.ShardLoad(shard=name, cpu_cores=round(self.rng.uniform(0.5, 4.0), 2), rss_bytes=8 * GiB)
            for name in sorted(self.shards)
        ]
        busy = cpus * self.cpu / 100
        return protocol.Load(
            cpu_percent=round(self.cpu, 2),
            cpus=cpus,
            load1=round(busy, 2),
            load5=round(busy * 0.9, 2),
            load15=round(busy * 0.8, 2),
            memory_used_bytes=used,
            memory_available_bytes=total - used,
            interval_seconds=5.0,
            shards=shard_loads,
        )

    def statuses(self) -> list[protocol.ShardStatus]:
        return [
            protocol.ShardStatus(shard=name, state="running", pid=10000 + i, metrics_port=8100 + i)
            for i, name in enumerate(sorted(self.shards))
        ]

    def heartbeat(self) -> protocol.Heartbeat:
        digest = self.digest
        send_inventory = digest != self.acknowledged_hash or self.inventory_wanted
        return protocol.Heartbeat(
            inventory_hash=digest,
            inventory=self.inventory if send_inventory else None,
            load=self.load(),
            shards=self.statuses(),
            sent_at=max(time.time() + self.skew, 0.0),
        )


def make_inventory(node_id: str, rng: random.Random) -> protocol.Inventory:
    """A plausible machine: one of MACHINES, with storage, weights, fabrics and engines."""
    kind = rng.choices(MACHINES, weights=[m[-1] for m in MACHINES])[0]
    name, gpu_name, gpu_count, gpu_memory, memory, cpus, _ = kind
    gpus = []
    for index in range(gpu_count):
        # One GPU in fifty has ECC errors: it must never count as free.
        bad = rng.random() < 0.02
        gpus.append(
            protocol.GPU(
                index=index,
                uuid=f"GPU-{node_id}-{index:02d}",
                name=gpu_name,
                memory_bytes=gpu_memory,
                ecc_errors=3 if bad else 0,
                health="ECC errors: 3 uncorrectable" if bad else "ok",
            )
        )
    local_total = rng.choice((3840, 7680, 15360)) * 10**9
    filesystems = [
        protocol.Filesystem(
            mount="/models",
            fstype="xfs",
            total_bytes=local_total,
            free_bytes=int(local_total * rng.uniform(0.2, 0.9)),
        ),
        protocol.Filesystem(mount="/filer", fstype="nfs4", total_bytes=500 * TiB, free_bytes=180 * TiB, shared=True),
    ]
    weights = [
        protocol.Weights(path=path, size_bytes=size, format=fmt)
        for path, size, fmt in MODELS
        if path.startswith("/filer") or rng.random() < 0.6
    ]
    rack = rng.randrange(1, 41)
    fabrics = []
    if gpu_count == 8:
        fabric = f"ib-{'east' if rack <= 20 else 'west'}"
        fabrics = [protocol.Fabric(name=fabric, hcas=[f"mlx5_{i}" for i in range(4)], rate_gbps=400)]
    engines = {engine: version for engine, version in ENGINES.items() if gpu_count or engine == "llama.cpp"}
    return protocol.Inventory(
        hostname=f"{node_id}.dc1.example.net",
        mgmt_addr=f"10.{rack}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
        labels={"rack": f"r{rack:02d}", "zone": "east" if rack <= 20 else "west", "class": name},
        memory_total_bytes=memory,
        host=protocol.Host(
            os="Ubuntu",
            os_version="22.04",
            kernel="5.15.0-119-generic",
            arch="x86_64",
            cpu_model="AMD EPYC 9654 96-Core Processor" if cpus > 100 else "Intel Xeon Gold 6338",
            cpus=cpus,
        ),
        agent_version="0.1.0",
        engine_versions=engines,
        engines_probed=True,
        provision=[protocol.EngineInstall(engine=engine, version=version) for engine, version in engines.items()],
        gpus=gpus,
        filesystems=filesystems,
        weights=weights,
        weights_scanned=True,
        fabrics=fabrics,
    )


async def post(host: str, port: int, path: str, token: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    """POST over a fresh connection; (status, body). Raises OSError or asyncio.TimeoutError."""

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                f"POST {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()

    raw = await asyncio.wait_for(exchange(), timeout)
    head, _, content = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise ConnectionError("no HTTP status line in the answer") from None
    return status, content


class Fleet:
    """The simulated nodes, their beat loops and the record of every request."""

    def __init__(
        self,
        host: str,
        port: int,
        join_token: str,
        nodes: int,
        interval: float = 5.0,
        seed: int = 1,
        concurrency: int = 200,
        timeout: float = 10.0,
        prefix: str = "sim",
    ):
        self.host, self.port, self.join_token = host, port, join_token
        self.interval = interval
        self.timeout = timeout
        rng = random.Random(seed)
        self.nodes = [
            SimNode(node_id=f"{prefix}-{i:05d}", inventory=make_inventory(f"{prefix}-{i:05d}", rng))
            for i in range(nodes)
        ]
        for node in self.nodes:
            node.rng = random.Random(rng.random())
        self.by_id = {node.node_id: node for node in self.nodes}
        self.requests: list[Request] = []
        # Bounds the connections open at once, below the listen backlog of the server it connects to.
        self.gate = asyncio.Semaphore(concurrency)
        self.stopping = asyncio.Event()
        self.inventory_changes = 0

    async def _call(self, kind: str, token: str, body: bytes) -> tuple[int, bytes]:
        path = "/api/v1/register" if kind == "register" else "/api/v1/heartbeat"
        async with self.gate:
            started = time.time()
            clock = time.perf_counter()
            try:
                status, content = await post(self.host, self.port, path, token, body, self.timeout)
            except (TimeoutError, OSError) as exc:
                error = type(exc).__name__
                self.requests.append(Request(started, time.perf_counter() - clock, kind, 0, error))
                # A refused connection stored nothing; a timeout or a reset may have.
                return 0, error.encode()
            self.requests.append(Request(started, time.perf_counter() - clock, kind, status))
            return status, content

    async def register(self, node: SimNode) -> bool:
        message = protocol.Register(node_id=node.node_id, inventory=node.inventory, inventory_hash=node.digest)
        status, content = await self._call("register", self.join_token, protocol.encode(message))
        if status not in (200, 201):
            return False
        registered = protocol.decode(content, protocol.Registered)
        node.token = registered.token
        node.acknowledged_hash = message.inventory_hash
        return True

    async def beat(self, node: SimNode) -> int:
        """One heartbeat (registering first if need be); its HTTP status, 0 when none came."""
        if node.token is None and not await self.register(node):
            return 0
        assert node.token is not None, "registered just above"
        message = node.heartbeat()
        node.inflight = True
        try:
            status, content = await self._call("heartbeat", node.token, protocol.encode(message))
        finally:
            node.inflight = False
        if status == 200 or (status == 0 and content != b"ConnectionRefusedError"):
            node.stored_until = time.time()
        if status == 401:
            node.token = None  # the agent registers again, so does the simulator
            return status
        if status != 200:
            return status
        node.last_ok_at = node.stored_until
        try:
            reply = protocol.decode(content, protocol.HeartbeatReply)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return status
        if message.inventory is not None:
            node.acknowledged_hash = message.inventory_hash
        node.inventory_wanted = reply.inventory_wanted
        if reply.shards is not None:
            node.shards = {spec.shard: spec for spec in reply.shards[: protocol.MAX_SHARDS]}
        return status

    async def run_node(self, node: SimNode) -> None:
        # Spread the fleet over one interval, as real nodes booted at different times are.
        await asyncio.sleep(node.rng.uniform(0, self.interval))
        next_at = time.monotonic()
        while not self.stopping.is_set():
            if not node.silent:
                await self.beat(node)
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (an outage's timeouts): skip ahead, never burst
                next_at = time.monotonic()
                delay = 0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)

    def change_inventory(self, node: SimNode) -> None:
        """What an operator replacing a disk or a GPU failing does: the next beat carries it."""
        fs = node.inventory.filesystems[0]
        node.inventory = msgspec.structs.replace(
            node.inventory,
            filesystems=[
                msgspec.structs.replace(fs, free_bytes=max(fs.free_bytes - 10**9, 0)),
                *node.inventory.filesystems[1:],
            ],
        )
        self.inventory_changes += 1

    async def run(self) -> None:
        await asyncio.gather(*(self.run_node(node) for node in self.nodes))

    def stop(self) -> None:
        self.stopping.set()
