"""The `llmgw` command against a real server (Django's live server): what it prints, saves and exits with."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
import requests
import time_machine
from django.db import OperationalError, connection

from gateway import usage
from gateway.models import ApiKey, Tenant, key_digest
from gateway.usage import Counted
from inventory.models import Deployment, Node
from inventory.reconcile import reconcile
from llmgwctl import commands
from llmgwctl.client import AUTH, OK, UNREACHABLE, Failure
from llmgwctl.main import main
from tests.opsapi_support import free_port, make_token, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("LLMGW_URL", raising=False)
    monkeypatch.delenv("LLMGW_TOKEN", raising=False)
    return tmp_path / "config" / "llmgw"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def logged_in(live_server, operator, monkeypatch, home):
    _, secret = make_token(operator, scope="operate")
    monkeypatch.setenv("LLMGW_URL", live_server.url)
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    return secret


def test_the_package_never_imports_django():
    script = (
        "import sys, llmgwctl.main, llmgwctl.commands, llmgwctl.show;"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'inventory', 'nodes', 'opsapi')]"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "DJANGO_SETTINGS_MODULE": ""})


def test_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "exit codes:" in capsys.readouterr().out


def test_without_a_login_it_says_so_in_one_line(capsys, home):
    code, out, err = run(capsys, "nodes")
    assert code == 3 and out == "" and err.count("\n") == 1 and "llmgw login" in err


def test_a_usage_mistake_is_one_line_and_exit_2(capsys, home):
    with pytest.raises(SystemExit) as exited:
        main(["cordon", "n1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_login_checks_the_token_and_saves_it_for_the_user_only(capsys, live_server, viewer, home, monkeypatch):
    _, secret = make_token(viewer)
    monkeypatch.setattr(sys, "stdin", io.StringIO("llmgw-ops-0123456789abcdef.wrong\n"))
    code, _, err = run(capsys, "login", live_server.url, "--token-stdin")
    assert code == 3 and "401" in err and not (home / "config.json").exists()
    monkeypatch.setattr(sys, "stdin", io.StringIO(secret + "\n"))
    code, out, _ = run(capsys, "login", live_server.url, "--token-stdin")
    assert code == 0 and "as viewer" in out
    saved = home / "config.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert secret in saved.read_text()
    # And the saved login is used from then on.
    assert run(capsys, "nodes")[0] == 0


def test_nodes_fit_80_columns_and_json_is_exactly_the_answer(capsys, logged_in, cluster, live_server):
    Node.objects.filter(pk="ready-1").update(hostname="h" * 150, labels={"rack": "r" * 90})
    code, out, _ = run(capsys, "nodes")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["NODE", "STATE", "CPU", "RAM", "GPUS", "FREE", "HEARTBEAT"]
    assert len(lines) == 5 and all(len(line) <= 80 for line in lines)
    # The clock stands still, so the two answers' ages are the same.
    with time_machine.travel(time.time(), tick=False):
        code, out, _ = run(capsys, "nodes", "--state", "cordoned", "-o", "json")
        direct = requests.get(
            f"{live_server.url}/api/ops/v1/nodes/",
            params={"state": "cordoned", "sort": "id", "page": 1},
            headers={"Authorization": f"Bearer {logged_in}"},
            timeout=10,
        )
    assert code == 0 and out == direct.text + "\n"


def test_one_node_and_an_unknown_one(capsys, logged_in, cluster):
    code, out, _ = run(capsys, "node", "ready-1")
    assert code == 0 and "State:      ready" in out and all(len(line) <= 80 for line in out.splitlines())
    code, out, err = run(capsys, "node", "ghost")
    assert code == 4 and out == "" and "no node 'ghost'" in err


def test_a_node_shows_drain_progress_only_while_it_drains(capsys, logged_in, cluster):
    Deployment.objects.create(name="llama", model_source="llama", engine="demo", gpus_per_shard=1)
    reconcile()
    code, out, _ = run(capsys, "node", "ready-1")
    assert code == 0 and "Engines:" in out and "Drain:" not in out
    run(capsys, "drain", "ready-1", "--reason", "reboot")
    code, out, _ = run(capsys, "node", "ready-1")
    assert code == 0 and "Drain:      1 replicas left to move" in out


def test_cordon_by_label_then_uncordon(capsys, logged_in, cluster):
    Node.objects.filter(pk__in=["ready-1", "cordoned-1"]).update(labels={"rack": "r12"})
    code, out, _ = run(capsys, "cordon", "-l", "rack=r12", "--reason", "kernel upgrade")
    assert code == 0 and out.splitlines() == ["cordoned-1 already cordoned", "ready-1 cordoned"]
    assert Node.objects.get(pk="ready-1").admin_state == "cordoned"
    code, _, _ = run(capsys, "uncordon", "ready-1", "--reason", "done")
    assert code == 0 and Node.objects.get(pk="ready-1").admin_state == "active"


def test_a_read_token_cannot_cordon(capsys, live_server, viewer, cluster, monkeypatch, home):
    _, secret = make_token(viewer)
    monkeypatch.setenv("LLMGW_URL", live_server.url)
    monkeypatch.setenv("LLMGW_TOKEN", secret)
    code, _, err = run(capsys, "cordon", "ready-1", "--reason", "x")
    assert code == 3 and "403" in err
    assert Node.objects.get(pk="ready-1").admin_state == "active"


def test_drain_wait_gives_up_at_its_timeout(capsys, logged_in, cluster):
    Deployment.objects.create(name="llama", model_source="llama", engine="demo", gpus_per_shard=1)
    reconcile()
    code, out, err = run(capsys, "drain", "ready-1", "--reason", "reboot", "--wait", "--timeout", "0.5")
    assert code == 5
    assert "1 replicas left to move" in out and "not drained yet: ready-1" in err


class Polls:
    """A control plane for wait_for_drain: each poll's answer in turn, a Failure raised as it comes."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def get(self, path: str):
        answer = self.answers.pop(0)
        if isinstance(answer, Failure):
            raise answer
        response = requests.Response()
        response.status_code, response._content = 200, json.dumps(answer).encode()
        return response


DRAINING = {"node": "n1", "admin_state": "draining", "drained": False, "replicas_left": 1}
DRAINED = {"node": "n1", "admin_state": "cordoned", "drained": True, "replicas_left": 0}


def test_drain_wait_asks_again_after_a_poll_the_control_plane_did_not_answer(capsys, monkeypatch):
    monkeypatch.setattr(commands, "POLL_SECONDS", 0.0)
    polls = Polls(DRAINING, Failure("HTTP 503 from the control plane", UNREACHABLE), DRAINED)
    assert commands.wait_for_drain(polls, ["n1"], timeout=30) == OK
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "drain: 1/1 nodes drained, 0 replicas left to move"
    assert "HTTP 503 from the control plane; asking again" in err


def test_drain_wait_ends_at_a_refusal_and_at_its_deadline_whatever_the_blips(monkeypatch):
    monkeypatch.setattr(commands, "POLL_SECONDS", 0.0)
    with pytest.raises(Failure) as refused:
        commands.wait_for_drain(Polls(Failure("HTTP 403", AUTH)), ["n1"], timeout=30)
    assert refused.value.code == AUTH
    with pytest.raises(Failure) as unanswered:
        commands.wait_for_drain(Polls(Failure("no answer", UNREACHABLE)), ["n1"], timeout=0)
    assert unanswered.value.code == UNREACHABLE


def test_drain_wait_exits_0_once_the_reconciler_has_cordoned_the_empty_node(capsys, logged_in, cluster):
    def reconciler() -> None:
        # Reconciler passes, as Celery beat runs them, until the drained node is cordoned. A pass
        # that meets SQLite's table lock (the live server shares the in-memory database) is
        # simply followed by the next, as on a real beat.
        def pass_done() -> bool:
            try:
                state = Node.objects.get(pk="ready-1").admin_state
                if state == "draining":
                    reconcile()
                return state == "cordoned"
            except OperationalError:
                return False

        try:
            wait_until(pass_done, 30, "the reconciler to cordon the drained node")
        finally:
            connection.close()

    helper = threading.Thread(target=reconciler)
    helper.start()
    code, out, _ = run(capsys, "drain", "ready-1", "--reason", "reboot", "--wait", "--timeout", "30")
    helper.join()
    assert code == 0 and out.splitlines()[-1] == "drain: 1/1 nodes drained, 0 replicas left to move"
    assert Node.objects.get(pk="ready-1").admin_state == "cordoned"


def test_deployments_and_scale(capsys, logged_in, cluster):
    Deployment.objects.create(name="big", model_source="big", gpus_per_shard=4, gpu_class="B200-192GB")
    reconcile()
    code, out, _ = run(capsys, "deployments")
    assert code == 0 and out.splitlines()[1].startswith("big") and "B200" in out
    code, out, _ = run(capsys, "scale", "big", "3")
    assert code == 0 and "3 replicas wanted" in out and Deployment.objects.get().replicas == 3
    assert run(capsys, "scale", "ghost", "1")[0] == 4


def test_events_print_one_line_each(capsys, logged_in, cluster):
    run(capsys, "cordon", "ready-1", "--reason", "kernel")
    code, out, _ = run(capsys, "events")
    assert code == 0 and "ready-1  admin active→cordoned  by operator via token" in out


def test_an_unreachable_control_plane_is_exit_6_in_one_line(capsys, monkeypatch, home):
    monkeypatch.setenv("LLMGW_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("LLMGW_TOKEN", "llmgw-ops-0123456789abcdef.x")
    code, _, err = run(capsys, "nodes")
    assert code == 6 and err.startswith("llmgw: cannot reach") and err.count("\n") == 1


def test_keys_create_list_revoke(capsys, logged_in):
    Tenant.objects.create(name="acme")
    code, out, _ = run(capsys, "keys", "create", "acme", "--name", "billing")
    assert code == 0
    secret = out.splitlines()[-1]
    (made,) = ApiKey.objects.all()
    assert made.digest == key_digest(secret)
    code, out, _ = run(capsys, "keys")
    assert code == 0 and made.prefix in out and secret not in out and "usable" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, _ = run(capsys, "keys", "revoke", str(made.pk))
    assert code == 0 and "revoked" in out
    assert run(capsys, "keys", "list", "--tenant", "acme")[1].count("revoked") == 1
    code, _, err = run(capsys, "keys", "create", "nobody")
    assert code != 0 and "tenant" in err


def test_tenants_create_set_and_clear_limits(capsys, logged_in):
    code, out, _ = run(capsys, "tenants", "create", "acme", "--rps", "5")
    assert code == 0 and "acme" in out
    assert Tenant.objects.get().requests_per_second == 5
    code, out, _ = run(capsys, "tenants", "set", "acme", "--concurrent", "2")
    tenant = Tenant.objects.get()
    # Only what was given changes: the rate stays.
    assert code == 0 and (tenant.requests_per_second, tenant.concurrent_requests) == (5, 2)
    assert run(capsys, "tenants", "set", "acme", "--rps", "none")[0] == 0
    assert Tenant.objects.get().requests_per_second is None
    code, out, _ = run(capsys, "tenants")
    assert run(capsys, "tenants", "set", "acme", "--tpd", "1000")[0] == 0
    code, out, _ = run(capsys, "tenants")
    assert code == 0 and out.splitlines()[1].split() == ["acme", "active", "—", "2", "—", "1000", "0"]
    with pytest.raises(SystemExit) as exited:
        main(["tenants", "set", "acme", "--rps", "-3"])
    assert exited.value.code == 2 and "--rps" in capsys.readouterr().err
    code, _, err = run(capsys, "tenants", "set", "nobody", "--rps", "1")
    assert code == 4 and "nobody" in err


def test_usage_prints_a_tenants_tokens(capsys, logged_in):
    usage.record({("acme", "chat", "r1"): Counted(2, 10, 20), ("other", "chat", "r1"): Counted(1, 1, 1)})
    code, out, _ = run(capsys, "usage", "--tenant", "acme", "--since", "24h")
    assert code == 0 and out.splitlines()[1].split() == ["acme", "chat", "r1", "2", "10", "20"]
    assert len(out.splitlines()) == 2
    code, _, err = run(capsys, "usage", "--since", "soon")
    assert code != 0 and "since" in err
