"""The gateway's HAProxy files, from what should be: its config (deploy/gateway.cfg), maps and error pages.

Everything here is pure: the sync (`gateway.sync`) decides when to write and when to reload.
The config holds the last known servers of each backend as plain `server` lines, and the maps
hold the last known keys and models, so an HAProxy restarted while the control plane is down
comes back serving what it served before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "gateway.cfg"
# The Lua filter counting the engines' tokens (gateway.usage reads its totals).
USAGE_LUA = ROOT / "deploy" / "gateway_usage.lua"
# The stream relay: streams through it end with an SSE error event when their engine cuts them (docs/gateway.md).
RELAY_LUA = ROOT / "deploy" / "gateway_relay.lua"
# Lua time a relayed stream may take (tune.lua.service-timeout): its running time, not its waits (a 6 s
# stream passed under a 2 s limit), which a stream of many tokens adds up past the default 4 s.
RELAY_LUA_TIMEOUT = "10m"
# Streams go through the relay (a body whose `stream` is true: json_query answers the boolean), with
# what their engine kind needs to put a running usage on every event (running_usage.map).
RELAY_STREAMS = (
    "    acl streamed req.body,json_query('$.stream') -m bool\n"
    "    http-request set-var(txn.running_usage) var(txn.backend),map({running_usage_map}) if streamed\n"
    "    http-request use-service lua.llmgw_relay if streamed"
)
# The largest request body admitted by default; larger ones get 413 before reaching an engine.
# req.body sees one buffer, so the buffer is sized to hold it (`Frontend.bufsize`); HAProxy
# needs glibc's allocator fixed for buffers this large (docs/gateway.md, "What it costs"), and
# a fleet whose prompts are smaller may set a smaller limit (`gateway_sync --max-body`).
MAX_BODY = 262_144
# Room in the buffer beside the body: the headers, and HAProxy's rewrite reserve (tune.maxrewrite).
HEADER_ROOM = 16_384
# The smallest buffer the stream relay works with: more than one read of its internal socket can bring (the
# kernel queues up to net.core.wmem_default, 208 KiB, on a unix socket), so that an answer arriving faster
# than the relay reads it does not fill the relay's buffer at once, which 2.6's Lua socket never recovers
# from (deploy/gateway_relay.lua's watchdog; docs/gateway.md, "The stream relay"). A number of its own, the
# default's buffer today, so that a smaller default body limit would not lower it.
RELAY_BUFSIZE = 278_528
PRODUCTION_MAXCONN = 20_000
# Seconds a client has to send its whole request, headers and body, before a 408: what a slow
# (or deliberately slow) client may hold a connection and a buffer for.
REQUEST_TIMEOUT = 30
# A replica's weight until engines' load reports set it (load-aware routing, another issue).
DEFAULT_WEIGHT = 100


class ServerState:
    """An HAProxy server's admin state as the sync sets it."""

    READY = "ready"
    # No new requests; those in flight finish: a server leaving while requests are on it (gateway.sync).
    DRAIN = "drain"


@dataclass(frozen=True)
class Server:
    """One replica as a server of its model's backend: where its engine answers, how much, in which state."""

    name: str
    address: str
    port: int
    weight: int = DEFAULT_WEIGHT
    state: str = ServerState.READY
    # Requests this gateway sends it at once (the deployment's max in flight per replica); the rest
    # wait in HAProxy's queue, tenants under their fair share first (gateway.fairness). 0: no limit.
    maxconn: int = 0


@dataclass(frozen=True)
class Backend:
    """One deployment: its served model name, the secret its engines take, and its servers."""

    served_model: str
    engine_secret: str
    servers: tuple[Server, ...] = ()
    # Requests that start alike go to one replica, for engines that cache prompts (PREFIX_AFFINITY).
    prefix_affinity: bool = False
    # What its engine kind's record adds to a streamed request for a running usage (EngineKind.running_usage).
    running_usage: str = ""

    @property
    def name(self) -> str:
        # Served names keep to HAProxy's name alphabet (inventory SERVED_MODEL_VALIDATOR).
        return f"m_{self.served_model}"


@dataclass(frozen=True)
class Desired:
    """What the gateway should be: backends by served model name, tenants by key digest, and tenants' limits."""

    backends: dict[str, Backend] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    # Tenant → its limit, for the tenants that have one (gateway.limits).
    requests_per_second: dict[str, str] = field(default_factory=dict)
    concurrent_requests: dict[str, str] = field(default_factory=dict)
    # Tenant → `window:limit:seconds` for the tenants whose token budget is spent (gateway.budgets).
    budget_spent: dict[str, str] = field(default_factory=dict)
    # Backend → `share:capacity` for the backends whose servers have a maxconn (gateway.fairness); filled
    # by the sync from the tenants' requests on each model now.
    fair_shares: dict[str, str] = field(default_factory=dict)

    def shape(self) -> tuple[tuple[str, str, bool], ...]:
        """What only a reload can change: the backends and their engines' secrets."""
        return tuple(sorted((b.name, b.engine_secret, b.prefix_affinity) for b in self.backends.values()))

    def models_map(self) -> dict[str, str]:
        return {served: backend.name for served, backend in self.backends.items()}

    def running_usage_map(self) -> dict[str, str]:
        """Backend → what the stream relay appends to a streamed request's JSON object (no spaces: a map value)."""
        return {b.name: "," + b.running_usage for b in self.backends.values() if b.running_usage}

    def catalog(self) -> str:
        """GET /v1/models: the served models with a ready server, as OpenAI lists them (no spaces: a map value)."""
        ready = sorted(
            served
            for served, backend in self.backends.items()
            if any(s.state == ServerState.READY for s in backend.servers)
        )
        data = [{"id": served, "object": "model", "owned_by": "llmgw"} for served in ready]
        return json.dumps({"object": "list", "data": data}, separators=(",", ":"))

    def catalog_map(self) -> dict[str, str]:
        return {"models": self.catalog()}


# The table of each tenant's counters, when the gateway is the only one.
TENANTS_TABLE = "st_tenants"
# A gateway's name among several: its HAProxy peer name and its table's suffix.
PEER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
# How long an entry outlives the tenant's last request. A gateway's sync rewrites its tenants' requests
# in flight (gpt0) before half of it has passed, so that the others' copies stay while a stream lasts.
TENANTS_EXPIRE_S = 60


@dataclass(frozen=True)
class Peer:
    """One gateway among several: its name, and where its HAProxy's peers listener is (HOST:PORT)."""

    name: str
    address: str


@dataclass(frozen=True)
class Peering:
    """This gateway among several (docs/gateway.md, "Several gateways"): every gateway, itself included.

    Each gateway counts its tenants in its own table and only there; `peers` replicates every table to
    every gateway, and the limits are checked against the sum. `cert` (certificate and key, PEM) and
    `ca` make the gateways' connections TLS, each end proving itself with a certificate `ca` signed."""

    name: str
    peers: tuple[Peer, ...]
    cert: str = ""
    ca: str = ""

    def __post_init__(self):
        names = [peer.name for peer in self.peers]
        if self.name not in names:
            raise ValueError(f"this gateway ({self.name}) is not among the peers ({', '.join(names)})")
        if len(set(names)) != len(names):
            raise ValueError("two peers have one name")
        if bool(self.cert) != bool(self.ca):
            raise ValueError("TLS between peers needs both a certificate and a CA")

    @property
    def table(self) -> str:
        return tenants_table(self.name)

    @property
    def others(self) -> tuple[Peer, ...]:
        return tuple(peer for peer in self.peers if peer.name != self.name)


def tenants_table(gateway: str) -> str:
    return f"{TENANTS_TABLE}_{gateway}"


@dataclass(frozen=True)
class Frontend:
    """How one gateway instance listens: its address, the largest body it routes, how long a request may take."""

    bind: str
    max_body: int = MAX_BODY
    request_timeout: int = REQUEST_TIMEOUT
    # Where Prometheus scrapes the gateway's own series (HAProxy's exporter); empty: not exported.
    metrics_bind: str = ""
    # The other gateways whose tenants' counters add to this one's; None: this gateway alone.
    peering: Peering | None = None
    # Streams through the relay (an SSE error event when cut); False only to measure what it costs.
    relay: bool = True

    @property
    def tenants_table(self) -> str:
        return self.peering.table if self.peering else TENANTS_TABLE

    @property
    def bufsize(self) -> int:
        if self.relay:
            return max(self.max_body + HEADER_ROOM, RELAY_BUFSIZE)
        return self.max_body + HEADER_ROOM


@dataclass(frozen=True)
class Paths:
    """The files of one gateway instance, all in its own directory (private: the config holds secrets)."""

    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "gateway.cfg"

    @property
    def admin_socket(self) -> Path:
        return self.directory / "admin.sock"

    @property
    def relay_socket(self) -> Path:
        return self.directory / "relay.sock"

    @property
    def master_socket(self) -> Path:
        return self.directory / "master.sock"

    @property
    def keys_map(self) -> Path:
        return self.directory / "keys.map"

    @property
    def models_map(self) -> Path:
        return self.directory / "models.map"

    @property
    def running_usage_map(self) -> Path:
        return self.directory / "running_usage.map"

    @property
    def rps_map(self) -> Path:
        return self.directory / "rps.map"

    @property
    def concurrency_map(self) -> Path:
        return self.directory / "concurrency.map"

    @property
    def budget_map(self) -> Path:
        return self.directory / "budget.map"

    @property
    def fair_map(self) -> Path:
        return self.directory / "fair.map"

    @property
    def catalog_map(self) -> Path:
        return self.directory / "catalog.map"

    @property
    def errors(self) -> Path:
        return self.directory / "errors"


# The replies HAProxy makes itself (no server answered in time, the queue timed out, …), as
# OpenAI-shaped JSON. 429 is reserved for per-tenant limits and tells the client when to retry.
ERRORS: dict[int, tuple[str, str, str]] = {
    400: ("Bad Request", "The request could not be read", "invalid_request_error"),
    403: ("Forbidden", "Forbidden", "invalid_request_error"),
    408: ("Request Timeout", "The request was not received in time", "invalid_request_error"),
    413: ("Payload Too Large", "The request body is larger than {max_body} bytes", "invalid_request_error"),
    429: ("Too Many Requests", "Rate limit reached; retry after the time in Retry-After", "rate_limit_error"),
    500: ("Internal Server Error", "The gateway failed", "server_error"),
    502: ("Bad Gateway", "The model's engine gave an invalid response", "server_error"),
    # Also a request that waited in the model's queue past `timeout queue` (its replicas all busy).
    503: (
        "Service Unavailable",
        "No replica of the model is ready, or none became free within the gateway's queue timeout; retry later",
        "server_error",
    ),
    504: ("Gateway Timeout", "The model's engine did not answer in time", "server_error"),
}
RETRY_AFTER = {429: 1, 503: 1}


def key_digest(key: str) -> str:
    """The digest HAProxy computes of the bearer token (`sha2(256),hex,lower`): what the keys map holds."""
    return hashlib.sha256(key.encode()).hexdigest()


def error_page(status: int, max_body: int = MAX_BODY) -> bytes:
    reason, message, kind = ERRORS[status]
    message = message.format(max_body=max_body)
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    headers = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-cache",
        "Connection: close",
    ]
    if status in RETRY_AFTER:
        headers.append(f"Retry-After: {RETRY_AFTER[status]}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def max_connections() -> int:
    """As the web proxy's (devstack/proxy.py): what this machine's descriptor limit allows, at most production's."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return PRODUCTION_MAXCONN
    return max(min(PRODUCTION_MAXCONN, (hard - 100) // 2), 100)


# pool-max-conn -1: idle connections to the engine are kept (27k/s against 10.1k/s without).
# pool-purge-delay 1s: a server taken out is deleted only once its idle connections are closed,
# which the default 5 s took 15 s to do, and 1 s about 3.
SERVER_OPTIONS = "pool-max-conn -1 pool-purge-delay 1s"


def server_options(server: Server) -> str:
    """Its weight, its limit (if any) and the pool's options, as `server` lines and `add server` take them."""
    limit = f" maxconn {server.maxconn}" if server.maxconn else ""
    return f"weight {server.weight}{limit} {SERVER_OPTIONS}"


def server_line(server: Server) -> str:
    line = f"    server {server.name} {server.address}:{server.port} {server_options(server)}"
    return line + (" disabled" if server.state != ServerState.READY else "")


# Prefix affinity with bounded load: a consistent hash of the body's first bytes (the model and the
# start of the first message: a shared system prompt) picks the replica, unless that one already has
# 25 % more requests than the backend's average, then the next on the ring (bench/routing.py compares it).
PREFIX_AFFINITY = (
    "    balance hash req.body,bytes(0,320)",
    "    hash-type consistent",
    "    hash-balance-factor 125",
)


def metrics_section(frontend: Frontend) -> str:
    """HAProxy's built-in Prometheus exporter on its own address, apart from the clients' port (docs/gateway.md)."""
    if not frontend.metrics_bind:
        return ""
    lines = [
        "frontend metrics",
        f"    bind {frontend.metrics_bind}",
        "    no log",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    http-request return status 404 content-type text/plain string 'Only /metrics here'",
    ]
    return "\n".join(lines) + "\n"


# -- tenants' counters: one table, or one per gateway summed (docs/gateway.md, "Several gateways") ------------

PEERS_SECTION = "gateways"


def tenant_track(frontend: Frontend) -> str:
    """The rule tracking the request's tenant, for the request's life, in this gateway's own table."""
    return f"    http-request track-sc0 var(txn.tenant) table {frontend.tenants_table}"


def tenants_elsewhere(frontend: Frontend) -> str:
    """With peers: the tenant's requests admitted in the last second and in flight on the other gateways, from
    their tables as replicated here, summed into variables; read only for a tenant with that limit."""
    if frontend.peering is None:
        return ""
    lines = []
    for what, converter, limit in (
        ("rate", "table_gpc0_rate", "rps_limit"),
        ("in_flight", "table_gpt0", "concurrency_limit"),
    ):
        for index, peer in enumerate(frontend.peering.others):
            total = f",add(txn.{what}_elsewhere)" if index else ""
            count = f"var(txn.tenant),{converter}({tenants_table(peer.name)}){total}"
            lines.append(f"    http-request set-var(txn.{what}_elsewhere) {count} if {{ var(txn.{limit}) -m found }}")
    return "\n".join(lines)


def tenant_requests(frontend: Frontend, counter: str, what: str) -> str:
    """The sample the limit is compared with: this gateway's own counter, plus the others' when peered."""
    if frontend.peering is None or not frontend.peering.others:
        return counter
    return f"{counter},add(txn.{what}_elsewhere)"


def tenant_publish(frontend: Frontend) -> str:
    """With peers: an admitted request writes the tenant's requests in flight here (conn_cur, which peers do not
    send) into gpt0, which they do, so the others see it at once; the sync writes it again as requests end."""
    if frontend.peering is None:
        return ""
    return "    http-request sc-set-gpt0(0) sc_conn_cur(0)"


def peer_tls(peering: Peering) -> str:
    if not peering.cert:
        return ""
    return f" ssl crt {peering.cert} ca-file {peering.ca} verify required"


def tenant_tables(frontend: Frontend) -> str:
    """The tenants' tables: this gateway's alone, or every gateway's, each replicated to all by `peers`."""
    table = f"stick-table type string len 64 size 100k expire {TENANTS_EXPIRE_S}s store gpc0_rate(1s),conn_cur"
    peering = frontend.peering
    if peering is None:
        return f"backend {TENANTS_TABLE}\n    {table}"
    tls = peer_tls(peering)
    mine = next(peer for peer in peering.peers if peer.name == peering.name)
    lines = [
        "# This gateway's name among the peers (HAProxy's localpeer); its table is the only one it writes.",
        "global",
        f"    localpeer {peering.name}",
        "",
        "# Every gateway's tenants' table, each written by its own gateway alone and replicated to all. The",
        '# peers\' port has no password: reachable by the gateways only (docs/operations.md, "Several gateways").',
        f"peers {PEERS_SECTION}",
        f"    bind {mine.address}{tls}",
        *(
            f"    server {peer.name}" + ("" if peer.name == peering.name else f" {peer.address}{tls}")
            for peer in peering.peers
        ),
    ]
    for peer in peering.peers:
        lines += ["", f"backend {tenants_table(peer.name)}", f"    {table},gpt0 peers {PEERS_SECTION}"]
    return "\n".join(lines)


# Fair under pressure: each tenant's requests on each model now (in flight and queued), on this gateway,
# and how often it was refused for being over its fair share (gateway.fairness reads both).
FAIR_TABLE = "st_fair"
FAIR_REFUSALS = "gpc0_rate(10s)"


def fair_table_section() -> str:
    # Keys are `<backend>/<tenant>`: neither name holds a '/' (their validators).
    return (
        "# Each tenant's requests on each model (in flight and queued) on this gateway, and its refusals.\n"
        f"backend {FAIR_TABLE}\n"
        f"    stick-table type string len 200 size 100k expire 60s store conn_cur,{FAIR_REFUSALS}\n"
    )


def fairness_rules(backend: Backend, fair_map: Path) -> tuple[str, ...]:
    """Fair under pressure (docs/gateway.md), where the sync has written a fair share for the backend (its
    servers have a maxconn, `share:queue bound` in fair.map): a queued request waits behind those of tenants
    with fewer requests on the model (its priority class: the tenant's requests on it already), and a tenant
    with its fair share already on the model is refused once the queue reaches the bound (0 while other
    tenants want more than is left: so the model keeps room for them)."""
    on = "{ var(txn.fair) -m found }"
    over = "{ var(txn.fair_over) -m found }"
    message = (
        f"Model {backend.served_model} is saturated: tenant %[var(txn.tenant)] already has "
        "%[sc_conn_cur(1),sub(1)] requests on it and its fair share is %[var(txn.fair_share)]; retry after 1s"
    )
    refusal = f'{{"error":{{"message":"{message}","type":"requests","param":null,"code":"rate_limit_exceeded"}}}}'
    return (
        "    # Fair under pressure: the queue is served lowest class first, the class being the tenant's requests",
        "    # on this model already; a tenant at its fair share is refused once the queue reaches the bound.",
        f"    http-request set-var(txn.fair) str({backend.name}),map({fair_map})",
        f"    http-request track-sc1 str({backend.name}),concat(/,txn.tenant) table {FAIR_TABLE} if {on}",
        f"    http-request set-priority-class sc_conn_cur(1),sub(1) if {on}",
        f"    http-request set-var(txn.fair_share) var(txn.fair),field(1,:) if {on}",
        f"    http-request set-var(txn.fair_bound) var(txn.fair),field(2,:) if {on}",
        f"    http-request set-var(txn.fair_over) bool(true) if {on} {{ sc_conn_cur(1),sub(txn.fair_share) gt 0 }} "
        "{ queue,sub(txn.fair_bound) ge 0 }",
        f"    http-request sc-inc-gpc0(1) if {over}",
        f"    http-request return status 429 content-type application/json hdr Retry-After 1 lf-string '{refusal}' "
        f"if {over}",
    )


def backend_section(backend: Backend, fair_map: Path) -> str:
    lines = [
        f"backend {backend.name}",
        *(PREFIX_AFFINITY if backend.prefix_affinity else ("    balance leastconn",)),
        # Tokens counted here, where the server is known, whether the request came straight or by the relay.
        "    filter lua.llmgw_usage",
        "    http-reuse always",
        "    # The engines answer only requests carrying their deployment's secret: the gateways'.",
        f'    http-request set-header Authorization "Bearer {backend.engine_secret}"',
        "    http-request return status 503 content-type application/json hdr Retry-After 1 string "
        '\'{"error":{"message":"No replica of this model is ready; retry later","type":"server_error",'
        '"param":null,"code":"no_ready_replica"}}\' if { nbsrv eq 0 }',
        *fairness_rules(backend, fair_map),
        *(server_line(s) for s in backend.servers),
    ]
    return "\n".join(lines) + "\n"


def relay_streams(paths: Paths) -> str:
    return RELAY_STREAMS.replace("{running_usage_map}", str(paths.running_usage_map))


def render(paths: Paths, frontend: Frontend, desired: Desired, template: str | None = None) -> str:
    """deploy/gateway.cfg with its placeholders filled; a placeholder left over is a mistake, not a default."""
    text = TEMPLATE.read_text() if template is None else template
    fields = {
        "bind": frontend.bind,
        "bufsize": str(frontend.bufsize),
        "maxconn": str(max_connections()),
        "admin_socket": str(paths.admin_socket),
        "usage_lua": str(USAGE_LUA),
        "relay_lua": str(RELAY_LUA),
        "relay_lua_timeout": RELAY_LUA_TIMEOUT,
        "relay_socket": str(paths.relay_socket),
        "relay_streams": relay_streams(paths) if frontend.relay else "",
        "keys_map": str(paths.keys_map),
        "models_map": str(paths.models_map),
        "catalog_map": str(paths.catalog_map),
        "rps_map": str(paths.rps_map),
        "concurrency_map": str(paths.concurrency_map),
        "budget_map": str(paths.budget_map),
        "max_body": str(frontend.max_body),
        "request_timeout": f"{frontend.request_timeout}s",
        "errorfiles": "\n".join(f"    errorfile {code} {paths.errors / f'{code}.http'}" for code in ERRORS),
        "metrics": metrics_section(frontend),
        "tenant_track": tenant_track(frontend),
        "tenants_elsewhere": tenants_elsewhere(frontend),
        "tenant_rate": tenant_requests(frontend, "sc_gpc0_rate(0)", "rate"),
        "tenant_in_flight": tenant_requests(frontend, "sc_conn_cur(0)", "in_flight"),
        "tenant_publish": tenant_publish(frontend),
        "tenant_tables": tenant_tables(frontend),
        "backends": "\n".join(
            [fair_table_section(), *(backend_section(b, paths.fair_map) for _, b in sorted(desired.backends.items()))]
        ),
    }
    for name, value in fields.items():
        # A placeholder alone on its line that renders nothing leaves no empty line behind.
        text = text.replace("{{" + name + "}}" + ("\n" if not value else ""), value)
    if "{{" in text:
        raise ValueError(f"unfilled placeholder in {TEMPLATE}: {text[text.index('{{') :].splitlines()[0]}")
    return text


def map_text(entries: dict[str, str]) -> str:
    return "".join(f"{key} {value}\n" for key, value in sorted(entries.items()))


def write_private(path: Path, data: bytes) -> bool:
    """Replace `path` atomically with `data`, readable by its owner only; False when it already held it."""
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def write_all(paths: Paths, frontend: Frontend, desired: Desired) -> bool:
    """Every file of the instance, from `desired`; True when the config itself changed."""
    paths.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths.errors.mkdir(mode=0o700, exist_ok=True)
    for code in ERRORS:
        write_private(paths.errors / f"{code}.http", error_page(code, frontend.max_body))
    write_private(paths.keys_map, map_text(desired.keys).encode())
    write_private(paths.models_map, map_text(desired.models_map()).encode())
    write_private(paths.running_usage_map, map_text(desired.running_usage_map()).encode())
    write_private(paths.catalog_map, map_text(desired.catalog_map()).encode())
    write_private(paths.rps_map, map_text(desired.requests_per_second).encode())
    write_private(paths.concurrency_map, map_text(desired.concurrent_requests).encode())
    write_private(paths.budget_map, map_text(desired.budget_spent).encode())
    write_private(paths.fair_map, map_text(desired.fair_shares).encode())
    return write_private(paths.config, render(paths, frontend, desired).encode())
