"""The agent API's views: authenticate, validate, hand over. Nothing else happens here."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from agent import protocol
from nodes.api.heartbeats import authenticate, count_rejection, receive_heartbeat
from nodes.api.registration import join_token_name, register_node
from nodes.api.rejections import Rejected, bearer_token, decode, json_response, read_json_body


@csrf_exempt
def register(request: HttpRequest) -> HttpResponse:
    try:
        body = read_json_body(request)
        joined_with = join_token_name(bearer_token(request))
        if joined_with is None:
            raise Rejected(401, "Authorization", "unknown or revoked join token", "unauthorized")
        message = decode(body, protocol.Register)
    except Rejected as rejection:
        return rejection.response()
    return json_response(register_node(message, joined_with))


@csrf_exempt
def heartbeat(request: HttpRequest) -> HttpResponse:
    started = time.perf_counter()
    received_at = time.time()
    try:
        body = read_json_body(request)
        caller = authenticate(bearer_token(request))
        beat = decode(body, protocol.Heartbeat)
        reply = receive_heartbeat(caller, beat, received_at, started)
    except Rejected as rejection:
        count_rejection(rejection.outcome, started)
        return rejection.response()
    return json_response(reply)


@csrf_exempt
def empty(request: HttpRequest) -> HttpResponse:
    """The benchmark's ceiling: a view doing nothing, routed only when LLMGW_BENCH_EMPTY_VIEW is true."""
    return HttpResponse(b'{"state":"ready"}', content_type="application/json")
