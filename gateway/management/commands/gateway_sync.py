"""`manage.py gateway_sync --dir var/gateway --bind 127.0.0.1:8090`: program one gateway HAProxy, every second.

One per gateway instance, beside its HAProxy (started in master-worker mode with the
config and sockets in the same directory). Each pass also records the tokens its HAProxy
counted and writes the tenants' limits and spent budgets. With --name and --peer (every gateway,
this one included), the tenants' limits hold across the gateways: HAProxy's peers share their
counters (docs/gateway.md, "Several gateways" under Tenants). docs/gateway.md has the whole picture.
"""

from __future__ import annotations

import socket
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from prometheus_client import start_http_server

from gateway import haproxy_config, usage, wanted, weights
from gateway.haproxy_config import MAX_BODY, PEER_NAME, REQUEST_TIMEOUT, Frontend, Paths, Peer, Peering
from gateway.sync import Sync, loop
from livestate import inflight


def read_desired():
    # A database that went away and came back: a fresh connection rather than a dead one.
    close_old_connections()
    return wanted.read()


def peering(options) -> Peering | None:
    """This gateway among the --peer gateways; None when there are none. Each value goes into HAProxy's config."""
    if not options["peer"]:
        if options["peer_cert"] or options["peer_ca"]:
            raise CommandError("--peer-cert and --peer-ca need --peer")
        return None
    peers = []
    for given in options["peer"]:
        name, _, address = given.partition("=")
        host, _, port = address.rpartition(":")
        if not PEER_NAME.match(name):
            raise CommandError(
                f"--peer {given}: the name must be 1 to 32 lower-case letters, digits, '_' and '-', e.g. gw-a"
            )
        if not (host and port.isdigit() and 1 <= int(port) <= 65535 and not any(c.isspace() for c in host)):
            raise CommandError(f"--peer {given}: must be NAME=HOST:PORT, e.g. gw-a=10.0.0.1:10000")
        peers.append(Peer(name, address))
    files = {}
    for option in ("peer_cert", "peer_ca"):
        given = options[option]
        if given and not Path(given).is_file():
            raise CommandError(f"--{option.replace('_', '-')} {given}: no such file")
        # HAProxy reads it from its own working directory: written whole.
        files[option] = str(Path(given).resolve()) if given else ""
        if any(c.isspace() for c in files[option]):
            raise CommandError(f"--{option.replace('_', '-')} {given}: a path without spaces")
    try:
        return Peering(options["name"], tuple(peers), files["peer_cert"], files["peer_ca"])
    except ValueError as exc:
        raise CommandError(f"--peer: {exc}; --name names this gateway among them") from None


class Command(BaseCommand):
    help = "Program a gateway HAProxy with the fleet's ready replicas and the tenants' keys, every second."

    def add_arguments(self, parser):
        parser.add_argument("--dir", required=True, type=Path, help="the gateway's directory (config, maps, sockets)")
        parser.add_argument("--bind", required=True, help="the gateway's listening address, e.g. 127.0.0.1:8090")
        parser.add_argument(
            "--max-body",
            type=int,
            default=MAX_BODY,
            help=f"the largest request body routed, in bytes ({MAX_BODY}); larger ones get 413. HAProxy's buffer is"
            " sized from it, never below the default's while streams go through the relay",
        )
        parser.add_argument(
            "--request-timeout",
            type=int,
            default=REQUEST_TIMEOUT,
            help=f"seconds a client has to send its whole request ({REQUEST_TIMEOUT}); slower ones get 408",
        )
        parser.add_argument(
            "--name",
            default="",
            help="this gateway's name in its in-flight reports and among the --peer gateways "
            "(default: host name and --bind; with --peer, one of theirs)",
        )
        parser.add_argument(
            "--peer",
            action="append",
            default=[],
            metavar="NAME=HOST:PORT",
            help="every gateway whose tenants' counters add up, this one included (its --name), each with its "
            "HAProxy's peers address; repeat for each. None: this gateway's limits are its own",
        )
        parser.add_argument("--peer-cert", default="", help="TLS between peers: this gateway's certificate, key (PEM)")
        parser.add_argument("--peer-ca", default="", help="TLS between peers: the CA that signed every gateway's")
        parser.add_argument(
            "--metrics-bind",
            default="",
            help="where HAProxy serves its Prometheus series (/metrics), e.g. 127.0.0.1:8091; none when empty",
        )
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
        parser.add_argument(
            "--metrics",
            metavar="HOST:PORT",
            help="serve the gateway's llmgw_gateway_* series for Prometheus here, e.g. 127.0.0.1:9491",
        )
        parser.add_argument("--render-only", action="store_true", help="write the files once and exit")

    def handle(self, *args, **options):
        paths = Paths(options["dir"].resolve())
        if not 1024 <= options["max_body"] <= 16 * 2**20:
            raise CommandError("--max-body must be from 1024 to 16777216 bytes")
        if not 1 <= options["request_timeout"] <= 600:
            raise CommandError("--request-timeout must be from 1 to 600 seconds")
        host, _, port = options["metrics_bind"].rpartition(":")
        if options["metrics_bind"] and not (host and port.isdigit() and 1 <= int(port) <= 65535 and " " not in host):
            # Written into HAProxy's config: a bad one would stop the gateway from starting.
            raise CommandError("--metrics-bind must be ADDRESS:PORT, e.g. 127.0.0.1:8091")
        frontend = Frontend(
            options["bind"],
            options["max_body"],
            options["request_timeout"],
            options["metrics_bind"],
            peering=peering(options),
        )
        if options["render_only"]:
            try:
                desired = read_desired()
            except Exception:  # no database yet: an empty gateway, programmed once the sync runs
                desired = haproxy_config.Desired()
            haproxy_config.write_all(paths, frontend, desired)
            return
        # Two gateways on one machine listen on two addresses.
        name = options["name"] or f"{socket.gethostname()} {options['bind']}"
        sync = Sync(
            paths,
            frontend,
            read_desired,
            record_usage=usage.record,
            report_in_flight=lambda counts: inflight.report(name, counts),
            read_queues=weights.queues,
        )
        if options["metrics"]:
            host, _, port = options["metrics"].rpartition(":")
            if not host or not port.isdigit():
                raise CommandError("--metrics must be HOST:PORT, e.g. 127.0.0.1:9491")
            try:
                start_http_server(int(port), addr=host, registry=sync.metrics.registry)
            except OSError as exc:
                raise CommandError(f"--metrics {options['metrics']}: {exc.strerror}") from None
        loop(sync, interval=options["interval"])
