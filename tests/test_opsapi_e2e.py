"""A maintenance script against the real stack: cordon a labelled rack, drain it with --wait while
its replicas are rebuilt on the other rack, uncordon; checked against the database and node history.

The stack is granian and Celery (beat included) as `make run` starts them; the
nodes are simulated agents speaking the real protocol; the script is the real
`llmgw` command in its own process, logged in with a token made on the Tokens page.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest
import requests
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from bench.soaklib.fleet import Fleet
from devstack.stack import Stack
from tests.opsapi_support import free_port, wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
API = "/api/ops/v1"


class Browser:
    """A person signed in to the pages, as the e2e tests of the pages do it."""

    def __init__(self, base: str, username: str, password: str):
        self.base = base
        self.session = requests.Session()
        self.session.get(f"{base}/admin/login/", timeout=10)
        self.session.post(
            f"{base}/admin/login/",
            data={"username": username, "password": password, "next": "/"},
            headers=self.csrf(f"{base}/admin/login/"),
            timeout=10,
        )

    def csrf(self, referer: str) -> dict:
        return {"X-CSRFToken": self.session.cookies["csrftoken"], "Referer": referer}

    def make_token(self, name: str, scope: str) -> str:
        page = f"{self.base}/tokens/"
        self.session.get(page, timeout=10)
        made = self.session.post(
            page, data={"name": name, "scope": scope, "lifetime_days": "7"}, headers=self.csrf(page), timeout=10
        )
        return re.search(r'id="token-secret">([^<]+)<', made.text).group(1)

    def revoke_in_admin(self, pk: int) -> None:
        page = f"{self.base}/admin/opsapi/apitoken/"
        self.session.post(
            page, data={"action": "revoke", "_selected_action": [pk]}, headers=self.csrf(page), timeout=10
        )


def test_a_rack_is_drained_by_script_while_its_replicas_move(tmp_path, redis_server):
    redis_url = redis_server if isinstance(redis_server, str) else redis_server.url
    database = tmp_path / "llmgw.sqlite3"
    stack = Stack(
        tmp_path,
        env={
            "DATABASE_URL": f"sqlite:///{database}",
            "REDIS_URL": redis_url,
            "LLMGW_BEAT_PERIOD": "1",
            "LLMGW_HEARTBEAT_INTERVAL": "1",
        },
        web_port=free_port(),
        workers=2,
    )
    base = f"http://127.0.0.1:{stack.web_port}"
    cli_env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    cli_env.pop("LLMGW_URL", None)
    cli_env.pop("LLMGW_TOKEN", None)

    def llmgw(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "llmgwctl", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=cli_env,
            cwd=ROOT,
            timeout=300,
        )

    def sql(query: str, *params) -> list[tuple]:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            return db.execute(query, params).fetchall()

    fleet = Fleet("127.0.0.1", stack.web_port, "", nodes=8, interval=1.0, prefix="rk")
    racks = {}
    for i, node in enumerate(fleet.nodes):
        racks[node.node_id] = "r12" if i < 4 else "r13"
        node.inventory = msgspec.structs.replace(node.inventory, labels={"rack": racks[node.node_id]})
    r12 = sorted(n for n, rack in racks.items() if rack == "r12")
    loop = asyncio.new_event_loop()
    fleet_thread = threading.Thread(target=lambda: loop.run_until_complete(fleet.run()), daemon=True)
    try:
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("ensure_admin", "--password-stdin", stdin="admin-pass-e2e\n", capture=True)
        stack.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User; User.objects.create_user('viewer', password='viewer-pass')",
        )
        stack.start_web()
        stack.start(stack.celery_part())
        fleet.join_token = (tmp_path / "join-token").read_text().strip()
        fleet_thread.start()

        admin = Browser(base, "admin", "admin-pass-e2e")
        operate = admin.make_token("maintenance", "operate")
        login = llmgw("login", base, "--token-stdin", stdin=operate + "\n")
        assert login.returncode == 0, login.stderr
        headers = {"Authorization": f"Bearer {operate}"}

        def api(method: str, path: str, **kwargs) -> requests.Response:
            return requests.request(method, base + API + path, headers=headers, timeout=10, **kwargs)

        wait_until(lambda: api("GET", "/nodes/").json()["count"] == 8, 60, "all 8 simulated nodes registered")
        # The deployment starts on rack r12 alone, so draining it must move every replica.
        setup = api("POST", "/node-actions/", json={"action": "cordon", "reason": "setup", "selector": "rack=r13"})
        assert setup.status_code == 200
        created = api(
            "POST",
            "/deployments/",
            json={"name": "chat", "model_source": "chat", "engine": "demo", "replicas": 3, "gpus_per_shard": 0},
        )
        assert created.status_code == 201, created.text

        def running_on() -> set[str]:
            rows = sql(
                "SELECT s.node_id FROM inventory_shard s JOIN inventory_replica r ON s.replica_id = r.id "
                "WHERE r.state = 'running'"
            )
            return {node for (node,) in rows}

        def running_count() -> int:
            return sql("SELECT COUNT(*) FROM inventory_replica WHERE state = 'running'")[0][0]

        wait_until(lambda: running_count() == 3, 90, "3 replicas running on rack r12")
        assert running_on() <= set(r12)
        assert api("POST", "/node-actions/", json={"action": "uncordon", "reason": "setup", "selector": "rack=r13"}).ok

        # The maintenance script.
        cordon = llmgw("cordon", "-l", "rack=r12", "--reason", "kernel 6.12")
        assert cordon.returncode == 0, cordon.stderr
        assert cordon.stdout.split() == [word for n in r12 for word in (n, "cordoned")]
        drain = llmgw("drain", "-l", "rack=r12", "--reason", "kernel 6.12", "--wait", "--timeout", "180")
        assert drain.returncode == 0, drain.stdout + drain.stderr
        assert drain.stdout.splitlines()[-1] == "drain: 4/4 nodes drained, 0 replicas left to move"

        # Drained, in the database: the replicas run on rack r13, nothing holds rack r12.
        assert running_count() == 3
        assert running_on().isdisjoint(r12)
        placeholders = ",".join("?" * len(r12))
        assert sql(f"SELECT COUNT(*) FROM inventory_allocation WHERE node_id IN ({placeholders})", *r12) == [(0,)]
        states = dict(sql(f"SELECT id, admin_state FROM inventory_node WHERE id IN ({placeholders})", *r12))
        assert set(states.values()) == {"cordoned"}

        uncordon = llmgw("uncordon", "-l", "rack=r12", "--reason", "kernel 6.12 done")
        assert uncordon.returncode == 0, uncordon.stderr
        assert {s for (s,) in sql(f"SELECT admin_state FROM inventory_node WHERE id IN ({placeholders})", *r12)} == {
            "active"
        }

        # Each node's history tells the whole maintenance, with who, why and which token.
        for node_id in r12:
            history = sql(
                "SELECT from_state, to_state, actor, reason FROM inventory_nodeevent "
                "WHERE node_id = ? AND kind = 'admin' ORDER BY id",
                node_id,
            )
            steps = [(f, t) for f, t, _, _ in history]
            assert steps == [
                ("active", "cordoned"),
                ("cordoned", "draining"),
                ("draining", "cordoned"),
                ("cordoned", "active"),
            ], history
            actors = [a for _, _, a, _ in history]
            assert actors[0].startswith("admin via token maintenance (") and actors[2] == "system"
            assert history[0][3] == "kernel 6.12" and history[3][3] == "kernel 6.12 done"
        logged = sql("SELECT change_message FROM django_admin_log WHERE object_id = ? ORDER BY id", r12[0])
        assert logged[0][0].startswith("active → cordoned: kernel 6.12 (through API token maintenance (")

        # The events endpoint followed the same story.
        events = llmgw("events", "--node", r12[0], "-o", "json")
        assert [e["to_state"] for e in json.loads(events.stdout)["events"] if e["kind"] == "admin"][-4:] == [
            "cordoned",
            "draining",
            "cordoned",
            "active",
        ]

        # A read token cannot act; a revoked or expired token is refused; nobody reads another's tokens.
        # (The viewer cannot sign in to the admin's login page, and staff may not make a token for
        # someone else and see it, so the viewer's is made as the Tokens page makes it, in a shell.)
        ((viewer_id,),) = sql("SELECT id FROM auth_user WHERE username = 'viewer'")
        read = stack.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User; from opsapi.forms import NewTokenForm; "
            "form = NewTokenForm({'name': 'viewers-own-laptop', 'scope': 'read', 'lifetime_days': 7}, "
            "user=User.objects.get(username='viewer')); form.is_valid(); print(form.make()[1])",
            capture=True,
        ).stdout.split()[-1]
        as_viewer = {**cli_env, "LLMGW_URL": base, "LLMGW_TOKEN": read}
        refused = subprocess.run(
            [sys.executable, "-m", "llmgwctl", "cordon", r12[0], "--reason", "x"],
            capture_output=True,
            text=True,
            env=as_viewer,
            cwd=ROOT,
            timeout=60,
        )
        assert refused.returncode == 3 and "403" in refused.stderr
        assert requests.get(f"{base}{API}/me/", headers={"Authorization": f"Bearer {read}"}, timeout=10).ok
        ((read_pk,),) = sql("SELECT id FROM opsapi_apitoken WHERE user_id = ?", viewer_id)
        secret_part = read.split(".", 1)[1]
        assert secret_part not in admin.session.get(f"{base}/admin/opsapi/apitoken/{read_pk}/change/", timeout=10).text
        own_page = admin.session.get(f"{base}/tokens/", timeout=10).text
        assert "viewers-own-laptop" not in own_page and secret_part not in own_page
        admin.revoke_in_admin(read_pk)
        assert (
            requests.get(f"{base}{API}/me/", headers={"Authorization": f"Bearer {read}"}, timeout=10).status_code == 401
        )
        expiring = admin.make_token("short", "read")
        stack.manage(
            "shell",
            "-c",
            "from django.utils import timezone; from opsapi.models import ApiToken; "
            "ApiToken.objects.filter(name='short').update(expires_at=timezone.now())",
        )
        expired = requests.get(f"{base}{API}/me/", headers={"Authorization": f"Bearer {expiring}"}, timeout=10)
        assert expired.status_code == 401

        # The served document describes what the server answers.
        document = requests.get(f"{base}{API}/schema/?format=json", timeout=10).json()
        registry = Registry().with_resource("urn:api", Resource.from_contents(document, DRAFT202012))
        for path, schema in (
            ("/nodes/", "NodeList"),
            ("/deployments/", "DeploymentList"),
            (f"/nodes/{r12[0]}/", "NodeDetail"),
        ):
            validator = Draft202012Validator({"$ref": f"urn:api#/components/schemas/{schema}"}, registry=registry)
            errors = [e.message for e in validator.iter_errors(api("GET", path).json())]
            assert not errors, (path, errors[:3])
    finally:
        loop.call_soon_threadsafe(fleet.stop)
        fleet_thread.join(timeout=15)
        stack.stop_all()
