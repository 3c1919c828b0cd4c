"""`llmgw`: the command line. Every failure is one line on stderr and an exit code (docs/api.md)."""

from __future__ import annotations

import argparse
import sys

from llmgwctl import __version__, commands
from llmgwctl.client import REFUSED, USAGE, Failure

EXIT_CODES = """exit codes:
  0  done
  1  the control plane refused the request (the message says which field)
  2  the command line is wrong
  3  not logged in, token refused or not allowed to do this
  4  no such node or deployment
  5  drain --wait timed out
  6  the control plane cannot be reached or failed
"""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line, and our usage exit code, instead of argparse's usage dump.
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(USAGE)


def limit(text: str) -> int | None:
    """A tenant's limit on the command line: a whole number, or `none` for no limit."""
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor none")
    return value


def parser() -> argparse.ArgumentParser:
    top = Parser(
        prog="llmgw",
        description="Operate an llmgw fleet: nodes, drains and deployments, through the control plane's API.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"llmgw {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    login = sub.add_parser("login", help="store the control plane's URL and an API token (from its Tokens page)")
    login.add_argument("url", help="the control plane, e.g. https://llmgw.example.org")
    login.add_argument("--token-stdin", action="store_true", help="read the token from standard input")
    login.add_argument("--ca-file", help="the certificate authority that signs the control plane's certificate")
    login.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="allow http:// to a non-loopback host",
    )
    login.set_defaults(run=commands.login)

    nodes = sub.add_parser("nodes", help="list nodes")
    nodes.add_argument("--state", choices=["ready", "cordoned", "draining", "unreachable", "lost"])
    nodes.add_argument("--label", "-l", metavar="KEY=VALUE", help="only nodes with this label")
    nodes.add_argument("--gpu", metavar="CLASS", help="only nodes with GPUs of this class, e.g. H100-80GB")
    nodes.add_argument("-q", metavar="TEXT", help="part of the id or hostname")
    nodes.add_argument("--sort", default="id", help="id, hostname, state, gpus, heartbeat, cpu, ram, load; -x descends")
    nodes.add_argument("--page", type=int, help="one page only (all pages by default)")
    nodes.add_argument("--page-size", type=int)
    nodes.add_argument("-o", "--output", choices=["wide", "json"])
    nodes.set_defaults(run=commands.nodes)

    node = sub.add_parser("node", help="show one node")
    node.add_argument("node", metavar="ID")
    node.add_argument("-o", "--output", choices=["json"])
    node.set_defaults(run=commands.node)

    for action, text in (
        ("cordon", "stop placing new replicas on nodes"),
        ("drain", "move nodes' replicas elsewhere, then cordon them"),
        ("uncordon", "accept placement on nodes again"),
    ):
        command = sub.add_parser(action, help=text)
        command.add_argument("nodes", nargs="*", metavar="ID")
        command.add_argument("-l", "--selector", metavar="KEY=VALUE[,…]", help="the nodes with these labels")
        command.add_argument("--reason", required=True, help="why: recorded in each node's history")
        command.add_argument("-o", "--output", choices=["json"])
        if action == "drain":
            command.add_argument("--wait", action="store_true", help="wait until drained (exit 5 on timeout)")
            command.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (600)")
        command.set_defaults(run=commands.act)

    deployments = sub.add_parser("deployments", help="list deployments and why replicas wait")
    deployments.add_argument("--page", type=int, default=1)
    deployments.add_argument("--page-size", type=int, default=100)
    deployments.add_argument("-o", "--output", choices=["json"])
    deployments.set_defaults(run=commands.deployments)

    scale = sub.add_parser("scale", help="set a deployment's number of replicas")
    scale.add_argument("name", metavar="NAME")
    scale.add_argument("replicas", type=int, metavar="N")
    scale.add_argument("-o", "--output", choices=["json"])
    scale.set_defaults(run=commands.scale)

    tenants = sub.add_parser("tenants", help="the gateway's tenants and their limits: list, create, set")
    tenant_actions = tenants.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    tenant_listing = tenant_actions.add_parser("list", help="list tenants (the default)")
    tenant_create = tenant_actions.add_parser("create", help="make a tenant")
    tenant_set = tenant_actions.add_parser("set", help="change a tenant's limits: gateways apply them within a second")
    for each in (tenant_create, tenant_set):
        each.add_argument("name", metavar="TENANT")
        # Absent unless given: `--rps none` (no limit) differs from leaving the limit as it is.
        each.add_argument(
            "--rps",
            type=limit,
            default=argparse.SUPPRESS,
            metavar="N|none",
            help="requests per second, on each gateway",
        )
        each.add_argument(
            "--concurrent",
            type=limit,
            default=argparse.SUPPRESS,
            metavar="N|none",
            help="requests in flight, on each gateway",
        )
        for option, text in (("--tpm", "tokens per minute (UTC)"), ("--tpd", "tokens per day (UTC)")):
            each.add_argument(option, type=limit, default=argparse.SUPPRESS, metavar="N|none", help=text)
    tenant_set.add_argument("--active", choices=["true", "false"], help="false: its keys are refused")
    for each in (tenants, tenant_listing, tenant_create, tenant_set):
        each.add_argument("-o", "--output", choices=["json"])
    tenants.set_defaults(run=commands.tenants, action="list")

    usage = sub.add_parser("usage", help="tokens per tenant, model and replica, as the engines reported them")
    usage.add_argument("--tenant", help="only this tenant's")
    usage.add_argument("--since", default="24h", help="how far back: 90m, 24h, 30d (24h)")
    usage.add_argument("-o", "--output", choices=["json"])
    usage.set_defaults(run=commands.usage)

    keys = sub.add_parser("keys", help="the gateway's API keys: list, create (shown once), revoke")
    key_actions = keys.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    listing = key_actions.add_parser("list", help="list keys (the default)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    create = key_actions.add_parser("create", help="make a key for a tenant; printed once")
    create.add_argument("tenant", metavar="TENANT")
    create.add_argument("--name", help="what the key is for")
    create.add_argument("--expires", metavar="ISO-DATE", help="when it stops working, e.g. 2027-06-30T00:00:00Z")
    revoke = key_actions.add_parser("revoke", help="revoke a key by its id: gateways refuse it within a second")
    revoke.add_argument("id", type=int, metavar="ID")
    for each in (keys, listing, create, revoke):
        each.add_argument("-o", "--output", choices=["json"])
    keys.set_defaults(run=commands.keys, action="list", tenant=None)

    events = sub.add_parser("events", help="node events; --follow keeps printing new ones")
    events.add_argument("--node", metavar="ID")
    events.add_argument("--since", type=int, metavar="CURSOR", help="after this event id")
    events.add_argument("--limit", type=int, default=50)
    events.add_argument("-f", "--follow", action="store_true")
    events.add_argument("-o", "--output", choices=["json"])
    events.set_defaults(run=commands.events)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except Failure as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        # An operator gets one line, never a traceback.
        print(f"llmgw: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return REFUSED
