"""A misbehaving Prometheus: answers of the wrong shape and a server that trickles.

Each is a real HTTP server in the test. The charts endpoint must answer with a
sentence saying what went wrong, never a 500, within the deadline however slowly
the server sends, and leave no thread of its own behind.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils.html import escape

from nodes import promquery
from nodes.promquery import PrometheusUnavailable

GOOD = {
    "status": "success",
    "data": {"resultType": "matrix", "result": [{"metric": {"window": "1m"}, "values": [[1000.0, "1.5"]]}]},
}


def answer(data: object) -> dict:
    return {"status": "success", "data": data}


# Each wrong shape, and the place the sentence must name.
WRONG_SHAPES = {
    "data is a list": (answer([]), "data is a list, not an object"),
    "data is null": (answer(None), "data is null, not an object"),
    "data is missing": ({"status": "success"}, "data is null, not an object"),
    "result type is missing": (answer({"result": []}), "data.resultType is None"),
    "result type is a vector": (answer({"resultType": "vector", "result": []}), "data.resultType is 'vector'"),
    "result is missing": (answer({"resultType": "matrix"}), "data.result is null, not a list"),
    "result holds numbers": (answer({"resultType": "matrix", "result": [1, 2, 3]}), "data.result[0] is a number"),
    "series without values": (
        answer({"resultType": "matrix", "result": [{"metric": {}}]}),
        "data.result[0].values is null, not a list",
    ),
    "series without metric": (
        answer({"resultType": "matrix", "result": [{"values": []}]}),
        "data.result[0].metric is null, not an object",
    ),
    "time is the string nan": (
        answer({"resultType": "matrix", "result": [{"metric": {}, "values": [["nan", "1"]]}]}),
        "data.result[0].values[0][0] is 'nan', not a time",
    ),
    "value is a bare number": (
        answer({"resultType": "matrix", "result": [{"metric": {}, "values": [[1000, 1]]}]}),
        "data.result[0].values[0][1] is a number, not a value in a string",
    ),
    "value is not a number": (
        answer({"resultType": "matrix", "result": [{"metric": {}, "values": [[1000, "many"]]}]}),
        "data.result[0].values[0][1] is 'many', not a number",
    ),
    "point is not a pair": (
        answer({"resultType": "matrix", "result": [{"metric": {}, "values": [[1000]]}]}),
        "data.result[0].values[0] is not a [time, value] pair",
    ),
}


@pytest.fixture
def prometheus_stub() -> Iterator[tuple[dict, str]]:
    """A Prometheus stand-in answering whatever JSON the test puts in `answers["body"]`."""
    answers: dict = {"body": GOOD}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answers["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield answers, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_a_wrong_shape_is_a_sentence_naming_the_place(prometheus_stub, case):
    answers, base = prometheus_stub
    answers["body"], place = WRONG_SHAPES[case]
    with pytest.raises(PrometheusUnavailable, match="unexpected shape") as raised:
        promquery.node_history("n1", base_url=base)
    assert place in str(raised.value)


def test_nan_and_infinite_values_are_gaps_not_errors(prometheus_stub):
    answers, base = prometheus_stub
    now = 1_000_000.0
    times = promquery.grid(now)
    answers["body"] = answer(
        {
            "resultType": "matrix",
            "result": [{"metric": {}, "values": [[times[0], "NaN"], [times[1], "+Inf"], [times[2], "2"]]}],
        }
    )
    history = promquery.node_history("n1", now=now, base_url=base)
    assert history.charts[0].values[0][:3] == [None, None, 2.0]


@pytest.fixture
def charts_client(client, operator, cluster, settings, prometheus_stub):
    answers, base = prometheus_stub
    settings.PROMETHEUS_URL = base
    client.force_login(operator)
    return client, answers


@pytest.mark.django_db
@pytest.mark.parametrize("case", ["data is a list", "data is null", "result holds numbers", "time is the string nan"])
def test_the_charts_endpoint_says_what_went_wrong_instead_of_failing(charts_client, case):
    client, answers = charts_client
    answers["body"], place = WRONG_SHAPES[case]

    response = client.get("/nodes/ready-1/charts/", headers={"HX-Request": "true"})

    assert response.status_code == 200
    html = response.content.decode()
    assert "History is unavailable" in html and "unexpected shape" in html
    assert escape(place) in html
    # The answer carries its own trigger, so the page asks again.
    assert 'hx-trigger="every 30s"' in html


@pytest.mark.django_db
def test_the_charts_come_back_when_prometheus_does(charts_client):
    client, answers = charts_client
    answers["body"] = answer(None)
    assert "History is unavailable" in client.get("/nodes/ready-1/charts/").content.decode()
    answers["body"] = GOOD
    html = client.get("/nodes/ready-1/charts/").content.decode()
    assert "History is unavailable" not in html and 'id="chart-data"' in html


class TrickleServer:
    """Answers a valid response one byte at a time, a quarter second apart, on one thread.

    One thread serves every connection in turn, so the test can tell its own thread
    from any the code under test starts.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        body = json.dumps(GOOD).encode()
        self.response = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                for i in range(len(self.response)):
                    if self.stopping.wait(0.25):
                        return
                    try:
                        conn.sendall(self.response[i : i + 1])
                    except OSError:
                        break  # the client gave up: serve the next one

    def __enter__(self) -> TrickleServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        self.listener.close()


def test_a_trickling_prometheus_is_cut_off_at_the_deadline_leaving_no_threads():
    with TrickleServer() as server:
        before = set(threading.enumerate())
        started = time.monotonic()
        with pytest.raises(PrometheusUnavailable, match="did not answer within 2 s"):
            promquery.node_history("n1", base_url=server.url)
        elapsed = time.monotonic() - started
        assert set(threading.enumerate()) == before
    # The deadline is for the whole request, not for each byte.
    assert elapsed < promquery.TIMEOUT + 0.4


@pytest.mark.django_db
def test_the_charts_endpoint_answers_by_the_deadline_when_prometheus_trickles(client, operator, cluster, settings):
    client.force_login(operator)
    with TrickleServer() as server:
        settings.PROMETHEUS_URL = server.url
        started = time.monotonic()
        response = client.get("/nodes/ready-1/charts/")
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert "did not answer within 2 s" in response.content.decode()
    assert elapsed < promquery.TIMEOUT + 0.4
