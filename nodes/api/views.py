"""The agent API's views: read, authenticate, validate, hand over, answer. Nothing else happens here.

Whatever is refused, including a request that needed the database while it was
down (nodes/api/outage.py), is answered with a `protocol.Rejection`. A wrong
credential is counted against its client address where it is found wrong
(nodes/ratelimit.py); a right one is never refused for that address's failures.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from agent import protocol
from inventory import heartbeat as inventory_heartbeat
from nodes.api import cards, proxyclock
from nodes.api.outage import database_unavailable, is_outage
from nodes.api.registration import join_token_name, register_node
from nodes.api.rejections import Answer, Rejected, bearer_token, decode, json_answer, json_response, read_json_body
from nodes.models import split_token
from nodes.ratelimit import address_of, check_registration, client_address, locked, refused_credential

_NODE_ID = re.compile(protocol.NodeId.__metadata__[0].pattern)  # type: ignore[attr-defined]  # an Annotated alias
UNKNOWN_TOKEN = "unknown or revoked node token"

View = Callable[[HttpRequest], HttpResponse]
# Django ships no types we install: its decorator, typed for the views here (agents carry no CSRF token).
csrf_exempt_view: Callable[[View], View] = csrf_exempt


@csrf_exempt_view
def register(request: HttpRequest) -> HttpResponse:
    address = client_address(request)
    try:
        body = read_json_body(request.META, request.read)
        joined_with = join_token_name(bearer_token(request.META))
        if joined_with is None:
            raise refused_credential(address, "unknown or revoked join token")
        # Counted only once the join token is known good, so a stranger cannot spend it.
        check_registration(address)
        message = decode(body, protocol.Register)
        return json_response(register_node(message, joined_with, address))
    except Rejected as rejection:
        return rejection.response()
    except DatabaseError as exc:
        if not is_outage(exc):
            raise
        return database_unavailable(exc).response()


@csrf_exempt_view
def heartbeat(request: HttpRequest) -> HttpResponse:
    """The heartbeat as a Django view; production serves the same answer from WSGI (nodes/api/fastpath.py)."""
    return answer_heartbeat(request.META, request.read).as_django()


def answer_heartbeat(meta: Mapping[str, Any], read: Callable[[int], bytes]) -> Answer:
    """A heartbeat request, given its WSGI environ and a reader of its body, and its answer.

    The request is read and its token parsed here; what the heartbeat changes and
    what the node is told is `inventory.heartbeat.receive`'s, called once.
    """
    started = time.perf_counter()
    received_at = time.time()
    address = address_of(meta)
    try:
        body = read_json_body(meta, read)
        sender = heartbeat_sender(bearer_token(meta), address, received_at)
        try:
            beat = decode(body, protocol.Heartbeat)
        except Rejected:
            # Only the node itself may learn what is wrong with its heartbeat.
            inventory_heartbeat.admit(sender, received_at)
            raise
        waited = proxyclock.waited_in_proxy(meta, received_at)
        reply = inventory_heartbeat.receive(sender, beat, received_at, started, waited)
    except inventory_heartbeat.Refused as refused:
        refusal_answer = refusal(refused, address, received_at)
        inventory_heartbeat.count_refused(refusal_answer.outcome, started)
        return refusal_answer.answer()
    except Rejected as rejection:
        inventory_heartbeat.count_refused(rejection.outcome, started)
        return rejection.answer()
    except DatabaseError as exc:
        if not is_outage(exc):
            raise
        unavailable = database_unavailable(exc)
        inventory_heartbeat.count_refused(unavailable.outcome, started)
        return unavailable.answer()
    return json_answer(reply)


def heartbeat_sender(token: str, address: str, received_at: float) -> inventory_heartbeat.Sender:
    """The node a bearer token names, or a 401 (counted against the address) if it is not a node's token."""
    node_id, secret = split_token(token)
    if len(node_id) > protocol.MAX_ID or not _NODE_ID.fullmatch(node_id):
        raise refused_credential(address, "not a node token", received_at)
    return inventory_heartbeat.Sender(node_id, secret, token, address, cards.proven, cards.keep_all)


def refusal(refused: inventory_heartbeat.Refused, address: str, received_at: float) -> Rejected:
    """The answer to a heartbeat its action refused."""
    match refused:
        case inventory_heartbeat.Replayed(seq=seq, newest=newest):
            reason = (
                f"heartbeat {seq} of this run is not newer than heartbeat {newest}, already received; nothing changed"
            )
            return Rejected(409, "$.seq", reason, "replayed")
        case inventory_heartbeat.TooManyHeartbeats(retry_after=retry_after):
            reason = f"more than {settings.LLMGW_HEARTBEAT_PER_MINUTE} heartbeats with this token per minute"
            return Rejected(429, "rate", reason, "rate_limited", retry_after)
        case inventory_heartbeat.TooManyWrongTokens():
            return locked(received_at)
        case inventory_heartbeat.WrongToken(counted=True):
            return Rejected(401, "Authorization", UNKNOWN_TOKEN, "unauthorized")
    # A wrong secret found in the database: counted against its address here.
    return refused_credential(address, UNKNOWN_TOKEN, received_at)


@csrf_exempt_view
def empty(request: HttpRequest) -> HttpResponse:
    """The benchmark's ceiling: a view doing nothing, routed only when LLMGW_BENCH_EMPTY_VIEW is true."""
    return HttpResponse(b'{"state":"ready"}', content_type="application/json")
