"""The commands: each asks the API, then prints its answer as text, or exactly as JSON with -o json."""

from __future__ import annotations

import getpass
import os
import sys
import time
from argparse import Namespace

from llmgwctl import config, show
from llmgwctl.client import AUTH, OK, REFUSED, TIMED_OUT, UNREACHABLE, USAGE, Client, Failure

ALL_PAGES_SIZE = 500
POLL_SECONDS = 2.0


def out(text: str) -> None:
    print(text, flush=True)


def client() -> Client:
    try:
        login = config.load()
    except config.NotLoggedIn as exc:
        raise Failure(str(exc), AUTH) from None
    return Client(login.url, login.token, login.ca_file, login.allow_insecure_http)


def login(args: Namespace) -> int:
    token = os.environ.get("LLMGW_TOKEN", "")
    if args.token_stdin:
        token = sys.stdin.readline().strip()
    elif not token:
        if not sys.stdin.isatty():
            raise Failure("no token: pass --token-stdin, set LLMGW_TOKEN, or run in a terminal", USAGE)
        token = getpass.getpass(f"API token for {args.url} (from its Tokens page): ").strip()
    if not token:
        raise Failure("no token given", USAGE)
    saved = config.Login(
        args.url.rstrip("/"), token, os.path.abspath(args.ca_file) if args.ca_file else "", args.allow_insecure_http
    )
    me = Client(saved.url, token, saved.ca_file, saved.allow_insecure_http).get("/me/").json()
    path = config.save(saved)
    token_info = me["token"]
    out(f"logged in to {args.url} as {me['user']} ({token_info['scope']} token {token_info['name']}); saved in {path}")
    return OK


def nodes(args: Namespace) -> int:
    api = client()
    query = {"state": args.state, "label": args.label, "gpu": args.gpu, "q": args.q, "sort": args.sort}
    if args.output == "json":
        # Exactly what the API returned: one page of it.
        response = api.get("/nodes/", **query, page=args.page or 1, page_size=args.page_size)
        sys.stdout.write(response.text + ("" if response.text.endswith("\n") else "\n"))
        return OK
    rows, page = [], args.page or 1
    while True:
        body = api.get("/nodes/", **query, page=page, page_size=args.page_size or ALL_PAGES_SIZE).json()
        rows += body["results"]
        if args.page or body["next"] is None:
            break
        page = body["next"]
    if body["load_problem"]:
        print(f"warning: {body['load_problem']}", file=sys.stderr)
    if not rows:
        print("no nodes match", file=sys.stderr)
        return OK
    out(show.nodes(rows, wide=args.output == "wide", width=_width(args.output == "wide")))
    return OK


def node(args: Namespace) -> int:
    response = client().get(f"/nodes/{_path(args.node)}/")
    if args.output == "json":
        return _raw(response)
    out(show.node(response.json()))
    return OK


def act(args: Namespace) -> int:
    if bool(args.nodes) == bool(args.selector):
        raise Failure(f"{args.command}: give node ids or -l key=value, not both and not neither", USAGE)
    body: dict = {"action": args.command, "reason": args.reason}
    if args.nodes:
        body["nodes"] = args.nodes
    else:
        body["selector"] = args.selector
    api = client()
    response = api.post("/node-actions/", body)
    answer = response.json()
    if args.output == "json" and not getattr(args, "wait", False):
        return _raw(response)
    for result in answer["results"]:
        verb = {"cordon": "cordoned", "drain": "draining", "uncordon": "uncordoned"}[args.command]
        out(f"{result['node']} {verb}" if result["changed"] else f"{result['node']} already {result['admin_state']}")
    if args.command == "drain" and args.wait:
        return wait_for_drain(api, [r["node"] for r in answer["results"]], args.timeout)
    return OK


def wait_for_drain(api: Client, node_ids: list[str], timeout: float) -> int:
    """Poll each node's drain until all are drained; a progress line whenever the count left changes.

    A poll the control plane did not answer (no answer, or a 5xx: a web host restarting, a
    database busy) is tried again at the next poll, until the deadline: a drain outlives such a
    blip, and so does the wait for it. Any other refusal ends the wait.
    """
    deadline = time.monotonic() + timeout
    shown: tuple = ()
    while True:
        try:
            progress = [api.get(f"/nodes/{_path(node_id)}/drain/").json() for node_id in node_ids]
        except Failure as exc:
            if exc.code != UNREACHABLE or time.monotonic() >= deadline:
                raise
            print(f"llmgw: {exc}; asking again", file=sys.stderr)
            time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
            continue
        # Someone uncordoned or cordoned a node meanwhile: its replicas will not move any more.
        stopped = [
            f"{p['node']} is {p['admin_state']}"
            for p in progress
            if p["admin_state"] != "draining" and not p["drained"]
        ]
        if stopped:
            raise Failure(f"drain stopped by someone else: {', '.join(stopped)}", REFUSED)
        left = sum(p["replicas_left"] for p in progress)
        done = sum(p["drained"] for p in progress)
        now = (left, done)
        if now != shown:
            out(f"drain: {done}/{len(progress)} nodes drained, {left} replicas left to move")
            shown = now
        if done == len(progress):
            return OK
        if time.monotonic() >= deadline:
            waiting = ", ".join(p["node"] for p in progress if not p["drained"])
            print(f"llmgw: timed out after {timeout:g}s; not drained yet: {waiting}", file=sys.stderr)
            return TIMED_OUT
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))


def deployments(args: Namespace) -> int:
    response = client().get("/deployments/", page=args.page, page_size=args.page_size)
    if args.output == "json":
        return _raw(response)
    rows = response.json()["results"]
    out(show.deployments(rows) if rows else "no deployments")
    return OK


def scale(args: Namespace) -> int:
    if args.replicas < 0:
        raise Failure("scale: the number of replicas cannot be negative", USAGE)
    response = client().patch(f"/deployments/{_path(args.name)}/", {"replicas": args.replicas})
    if args.output == "json":
        return _raw(response)
    d = response.json()
    out(f"{d['name']} scaled: {d['replicas_wanted']} replicas wanted, {d['replicas_running']} running")
    return OK


def events(args: Namespace) -> int:
    """Events after a cursor; with --follow, forever, one poll every two seconds. -o json: one answer a line."""
    api = client()
    since, limit = args.since, args.limit
    while True:
        response = api.get("/events/", node=args.node, since=since, limit=limit)
        body = response.json()
        if args.output == "json":
            if body["events"] or not args.follow:
                _raw(response)
        else:
            for event in body["events"]:
                out(show.event_line(event, _width(False)))
        if not args.follow:
            return OK
        since, limit = body["cursor"], 500
        if not body["more"]:
            time.sleep(POLL_SECONDS)


# The command line's names for a tenant's limits, and the API's.
LIMIT_OPTIONS = {
    "rps": "requests_per_second",
    "concurrent": "concurrent_requests",
    "tpm": "tokens_per_minute",
    "tpd": "tokens_per_day",
}


def tenants(args: Namespace) -> int:
    """`llmgw tenants [list|create|set]`: the gateway's tenants and their limits (`none`: no limit)."""
    api = client()
    if args.action in ("create", "set"):
        changes = {field: getattr(args, option) for option, field in LIMIT_OPTIONS.items() if hasattr(args, option)}
        if args.action == "create":
            response = api.post("/tenants/", {"name": args.name, **changes})
        else:
            if args.active is not None:
                changes["active"] = args.active == "true"
            response = api.patch(f"/tenants/{_path(args.name)}/", changes)
        if args.output == "json":
            return _raw(response)
        out(show.tenants([response.json()], _width(False)))
        return OK
    response = api.get("/tenants/")
    if args.output == "json":
        return _raw(response)
    rows = response.json()
    out(show.tenants(rows, _width(False)) if rows else "no tenants")
    return OK


def usage(args: Namespace) -> int:
    """`llmgw usage [--tenant T] [--since 24h]`: tokens per tenant, model and replica."""
    response = client().get("/usage/", tenant=args.tenant, since=args.since)
    if args.output == "json":
        return _raw(response)
    rows = response.json()["rows"]
    out(show.usage(rows, _width(False)) if rows else f"no usage since {response.json()['since']}")
    return OK


def keys(args: Namespace) -> int:
    """`llmgw keys [list|create|revoke]`: the gateway's API keys; a made key is printed this once."""
    api = client()
    if args.action == "create":
        body = {"tenant": args.tenant, "name": args.name or ""}
        if args.expires:
            body["expires_at"] = args.expires
        response = api.post("/keys/", body)
        if args.output == "json":
            return _raw(response)
        made = response.json()
        out(f"key {made['id']} for tenant {made['tenant']} (shown once, copy it now):\n{made['key']}")
        return OK
    if args.action == "revoke":
        response = api.delete(f"/keys/{args.id}/")
        if args.output == "json":
            return _raw(response)
        out(f"key {args.id} ({response.json()['prefix']}…) revoked")
        return OK
    response = api.get("/keys/", tenant=args.tenant)
    if args.output == "json":
        return _raw(response)
    rows = response.json()
    out(show.keys(rows, _width(False)) if rows else "no keys")
    return OK


def _raw(response) -> int:
    sys.stdout.write(response.text + ("" if response.text.endswith("\n") else "\n"))
    return OK


def _path(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def _width(wide: bool) -> int:
    if not wide:
        return 80
    try:
        return max(os.get_terminal_size().columns, 80)
    except OSError:
        return 200
