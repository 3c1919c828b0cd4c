"""The agent API's views: authenticate, validate, hand over. Nothing else happens here.

Whatever is refused, including a request that needed the database while it was
down (nodes/api/outage.py), is answered with a `protocol.Rejection`. A wrong
credential is counted against its client address where it is found wrong
(nodes/ratelimit.py); a right one is never refused for that address's failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from agent import protocol
from nodes.api.heartbeats import authenticate, count_rejection, receive_heartbeat
from nodes.api.outage import database_unavailable, is_outage
from nodes.api.registration import join_token_name, register_node
from nodes.api.rejections import Answer, Rejected, bearer_token, decode, json_answer, json_response, read_json_body
from nodes.ratelimit import address_of, check_registration, client_address, refused_credential


@csrf_exempt
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


@csrf_exempt
def heartbeat(request: HttpRequest) -> HttpResponse:
    """The heartbeat as a Django view; production serves the same answer from WSGI (nodes/api/fastpath.py)."""
    return answer_heartbeat(request.META, request.read).as_django()


def answer_heartbeat(meta: Mapping[str, Any], read: Callable[[int], bytes]) -> Answer:
    """A heartbeat request, given its WSGI environ and a reader of its body, and its answer."""
    started = time.perf_counter()
    received_at = time.time()
    address = address_of(meta)
    try:
        body = read_json_body(meta, read)
        token = bearer_token(meta)
        try:
            beat = decode(body, protocol.Heartbeat)
        except Rejected:
            # Only the node itself may learn what is wrong with its heartbeat.
            authenticate(token, address, received_at)
            raise
        caller = authenticate(token, address, received_at, beat)
        reply = receive_heartbeat(caller, beat, received_at, started)
    except Rejected as rejection:
        count_rejection(rejection.outcome, started)
        return rejection.answer()
    except DatabaseError as exc:
        if not is_outage(exc):
            raise
        rejection = database_unavailable(exc)
        count_rejection(rejection.outcome, started)
        return rejection.answer()
    return json_answer(reply)


@csrf_exempt
def empty(request: HttpRequest) -> HttpResponse:
    """The benchmark's ceiling: a view doing nothing, routed only when LLMGW_BENCH_EMPTY_VIEW is true."""
    return HttpResponse(b'{"state":"ready"}', content_type="application/json")
