"""The Prometheus client behind the node page's charts."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devstack.polling import wait_until
from devstack.ports import free_port
from nodes import promquery
from nodes.promquery import ChartSpec, PrometheusUnavailable
from tests.prometheus import ExpositionServer, PrometheusServer


def test_promql_string_escapes_quotes_and_backslashes():
    assert promquery.promql_string('a"b\\c') == '"a\\"b\\\\c"'


def test_every_chart_selects_the_node():
    specs = promquery.node_charts("gpu-07")
    assert {spec.key for spec in specs} == {
        "cpu",
        "memory",
        "load",
        "cores",
        "shard_memory",
        "queue",
        "running",
        "tokens",
        "gpu_utilization",
        "gpu_memory",
    }
    for spec in specs:
        assert 'node="gpu-07"' in spec.query
    assert any("llmgw:shard_queue_depth" in spec.query for spec in specs)
    assert any("llmgw:shard_requests_running" in spec.query for spec in specs)
    assert any("llmgw:shard_tokens_per_second" in spec.query for spec in specs)


def test_grid_is_an_hour_of_steps_ending_now():
    times = promquery.grid(now=1_000_007.4)
    assert len(times) == 3600 // 15 + 1
    assert times[-1] == 1_000_007.0
    assert times[0] == times[-1] - 3600
    assert all(b - a == 15 for a, b in itertools.pairwise(times))


def test_align_places_points_on_the_grid_and_names_series():
    times = [0.0, 15.0, 30.0, 45.0]
    spec = ChartSpec("cores", "Cores", "cores", "q", series_label="model")
    result = [
        {"metric": {"model": "zeta"}, "values": [[15, "2.5"], [45, "NaN"]]},
        {"metric": {"model": "alpha"}, "values": [[0, "1"], [30, "3"], [9999, "7"]]},
    ]
    names, values = promquery.align(result, times, spec)
    assert names == ["alpha", "zeta"]
    assert values == [[1.0, None, 3.0, None], [None, 2.5, None, None]]


def test_align_names_memory_series_by_what_they_measure():
    spec = ChartSpec("memory", "RAM", "bytes", "q", series_label="__name__")
    result = [
        {"metric": {"__name__": "llmgw_node_memory_used_bytes"}, "values": [[0, "1"]]},
        {"metric": {"__name__": "llmgw_node_memory_available_bytes"}, "values": [[0, "2"]]},
    ]
    names, _ = promquery.align(result, [0.0, 15.0], spec)
    assert names == ["available", "used"]


def test_prometheus_down_is_a_sentence():
    base = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnavailable, match=f"Prometheus at {base} is not reachable"):
        promquery.node_history("n1", base_url=base)


@pytest.fixture
def silent_server():
    """Accepts connections and never answers: a Prometheus that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_slow_prometheus_costs_at_most_the_timeout(silent_server):
    started = time.monotonic()
    with pytest.raises(PrometheusUnavailable, match="did not answer within 2 s"):
        promquery.node_history("n1", base_url=silent_server)
    # The six queries share one deadline: the first to hang spends it, and the rest are not tried.
    assert time.monotonic() - started < promquery.TIMEOUT + 1.0


@pytest.fixture
def answering_server():
    answers = {"status": 200, "body": b""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(answers["status"])
            self.send_header("Content-Length", str(len(answers["body"])))
            self.end_headers()
            self.wfile.write(answers["body"])

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield answers, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_something_that_is_not_prometheus_is_reported(answering_server):
    answers, base = answering_server
    answers.update(status=502, body=b"<html>bad gateway</html>")
    with pytest.raises(PrometheusUnavailable, match="answered HTTP 502 without its API's JSON"):
        promquery.query_range("up", 0, 60, 15, base_url=base)


def test_a_refused_query_says_why(answering_server):
    answers, base = answering_server
    answers.update(status=400, body=b'{"status":"error","errorType":"bad_data","error":"parse error"}')
    with pytest.raises(PrometheusUnavailable, match="refused the query \\(HTTP 400\\): parse error"):
        promquery.query_range("up{", 0, 60, 15, base_url=base)


EXPOSITION = """\
llmgw_node_cpu_utilization_percent{node="n1"} 37.5
llmgw_node_cpu_utilization_percent{node="other"} 99
llmgw_node_memory_used_bytes{node="n1"} 1073741824
llmgw_node_memory_available_bytes{node="n1"} 3221225472
llmgw_node_load{node="n1",window="1m"} 1.5
llmgw_node_load{node="n1",window="5m"} 1.25
llmgw_node_load{node="n1",window="15m"} 1
llmgw_shard_cpu_cores{node="n1",shard="s0",replica="r0",model="llama"} 2
llmgw_shard_cpu_cores{node="n1",shard="s1",replica="r0",model="llama"} 1.5
llmgw_shard_memory_bytes{node="n1",shard="s0",replica="r0",model="llama"} 2147483648
llmgw_gpu_utilization_percent{node="n1",gpu="0",uuid="GPU-a"} 87
llmgw_gpu_utilization_percent{node="n1",gpu="1",uuid="GPU-b"} 3
llmgw_gpu_utilization_percent{node="other",gpu="0",uuid="GPU-c"} 50
llmgw_gpu_memory_used_bytes{node="n1",gpu="0",uuid="GPU-a"} 65498251264
"""


@pytest.mark.slow
def test_history_from_a_real_prometheus(tmp_path):
    exposition = ExpositionServer(EXPOSITION).start()
    prometheus = PrometheusServer(tmp_path / "prometheus", f"127.0.0.1:{exposition.port}").start()
    try:
        wait_until(lambda: prometheus.samples('llmgw_node_cpu_utilization_percent{node="n1"}') >= 2, 30, "two scrapes")
        history = promquery.node_history("n1", base_url=prometheus.url)
    finally:
        prometheus.stop()
        exposition.stop()
    charts = {chart.key: chart for chart in history.charts}
    assert charts["cpu"].series == ["CPU %"]
    assert {v for v in charts["cpu"].values[0] if v is not None} == {37.5}
    assert charts["memory"].series == ["available", "used"]
    assert charts["load"].series == ["15m", "1m", "5m"]
    assert charts["cores"].series == ["llama"]
    assert {v for v in charts["cores"].values[0] if v is not None} == {3.5}
    assert {v for v in charts["shard_memory"].values[0] if v is not None} == {2 * 2**30}
    # No engine exports a queue depth here: an empty chart, not an error.
    assert charts["queue"].series == [] and not charts["queue"].has_data
    assert charts["gpu_utilization"].series == ["GPU 0", "GPU 1"]
    assert [{v for v in column if v is not None} for column in charts["gpu_utilization"].values] == [{87}, {3}]
    assert charts["gpu_memory"].series == ["GPU 0"]
