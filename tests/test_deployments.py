"""Deployments in the admin, the shards agents are told to run, and Prometheus' engine targets."""

from __future__ import annotations

import io
from ipaddress import ip_network

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import override_settings

from agent import admission, enginekinds, protocol
from devstack.faults import redis_unreachable
from inventory.desired import orders
from inventory.models import Allocation, Deployment, Engine, GPUClaim, Node, Replica, ReplicaState, Shard
from inventory.reconcile import reconcile
from tests.factories import deployment, node

pytestmark = pytest.mark.django_db

TARGETS = "/api/v1/prometheus/targets"


def run_everything() -> None:
    """Every agent reports every shard it was given as running."""
    for node_id in set(Shard.objects.values_list("node_id", flat=True)):
        given = orders(node_id).shards
        orders(node_id, [protocol.ShardStatus(shard=s.shard, state="running", metrics_port=s.port) for s in given])


# -- what agents are told ------------------------------------------------------------------------


def test_a_multi_node_shard_gets_its_gpus_and_only_its_fabrics_adapters(db):
    node("a", gpus=8, fabrics={"ib-a": ["mlx5_0", "mlx5_1"], "ib-b": ["mlx5_4"]})
    node("b", gpus=8, fabrics={"ib-a": ["mlx5_2"]})
    deployment(shards_per_replica=2, gpus_per_shard=8, model_source="/models/llama-70b")
    reconcile()
    spec_a, spec_b = orders("a").shards[0], orders("b").shards[0]
    assert spec_a.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert spec_a.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert spec_b.env["NCCL_IB_HCA"] == "mlx5_2"
    assert spec_a.env["LLMGW_SHARD_INDEX"] == "0" and spec_b.env["LLMGW_SHARD_INDEX"] == "1"
    assert spec_b.env["LLMGW_LEADER"] == f"{spec_a_addr()}:{spec_a.port}"
    assert spec_a.command[:3] == ["vllm", "serve", "/models/llama-70b"]
    assert "--pipeline-parallel-size" in spec_a.command and "--tensor-parallel-size" in spec_a.command
    assert spec_a.port == int(spec_a.command[spec_a.command.index("--port") + 1])


def spec_a_addr() -> str:
    return Node.objects.get(pk="a").mgmt_addr


@override_settings(LLMGW_ENGINE_SCRAPE_KEY="scrape-key")
def test_a_shards_engine_is_given_its_deployments_secret_and_llama_server_the_scrape_key(db):
    node("a", gpus=2)
    made = deployment(engine=Engine.LLAMA_CPP, gpus_per_shard=0, gpu_class="", served_model_name="chat")
    other = deployment("other", engine=Engine.VLLM, gpus_per_shard=1)
    assert len(made.engine_secret) >= 40 and made.engine_secret != other.engine_secret
    reconcile()
    specs = {spec.replica.rsplit("-r", 1)[0]: spec for spec in orders("a").shards}
    # The control plane names only llmgw's variables (the agent admits no other) ...
    assert specs["llama"].env[enginekinds.API_KEY_ENV] == made.engine_secret
    assert specs["llama"].env[enginekinds.SCRAPE_KEY_ENV] == "scrape-key"
    assert specs["other"].env[enginekinds.API_KEY_ENV] == other.engine_secret
    allowed = admission.Allowed(model_dirs=("/models",), command_programs=())
    assert [admission.shard_refusal(spec, allowed) for spec in specs.values()] == [None, None]
    # ... and the agent puts them where each engine's record says it reads them.
    llama_env = enginekinds.get("llama.cpp").environment(specs["llama"].env)
    assert llama_env["LLAMA_API_KEY"] == f"{made.engine_secret},scrape-key"
    assert enginekinds.get("vllm").environment(specs["other"].env)["VLLM_API_KEY"] == other.engine_secret
    # Never on the command line, where any user of the node could read it.
    assert made.engine_secret not in " ".join(specs["llama"].command)


def test_an_engine_secret_never_starts_with_a_dash(monkeypatch):
    # SGLang reads its key back from its --config file as a command-line word: "-…" would be a flag.
    from inventory.models import deployments

    drawn = iter(["-first", "-second", "third-is-fine"])
    monkeypatch.setattr(deployments.secrets, "token_urlsafe", lambda n: next(drawn))
    assert deployments.new_engine_secret() == "third-is-fine"


def test_a_served_model_name_defaults_to_the_name_and_is_never_a_path(db):
    assert deployment("plain").served_model_name == "plain"
    for bad in ("/models/x.gguf", "org/model", "two words", "-dash"):
        with pytest.raises(ValidationError) as raised:
            Deployment(name="x", model_source="m", served_model_name=bad).full_clean()
        assert "served_model_name" in raised.value.message_dict
    with pytest.raises(ValidationError) as raised:
        Deployment(name="y", model_source="m", served_model_name="plain").full_clean()
    assert "served_model_name" in raised.value.message_dict
    # Another deployment's name taken as a default still clashes, named on the field.
    Deployment.objects.filter(name="plain").update(served_model_name="chat")
    Deployment.objects.create(name="z", model_source="m", served_model_name="plain-z")
    with pytest.raises(ValidationError) as raised:
        Deployment(name="chat", model_source="m").full_clean()
    assert "served_model_name" in raised.value.message_dict


def test_a_single_node_cpu_shard_sees_no_gpu_and_no_fabric(db):
    node("a", gpus=2, fabrics={"ib": ["mlx5_0"]})
    deployment(
        engine=Engine.LLAMA_CPP, gpus_per_shard=0, gpu_class="", cpu_cores_per_shard=8, arguments="--ctx-size 4096"
    )
    reconcile()
    (spec,) = orders("a").shards
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "NCCL_IB_HCA" not in spec.env
    assert spec.command[0] == "llama-server"
    assert spec.command[-2:] == ["--ctx-size", "4096"]
    assert spec.command[spec.command.index("--threads") + 1] == "8"


def test_the_command_engine_fills_in_port_and_model(db):
    node("a", gpus=0)
    deployment(
        engine=Engine.COMMAND,
        gpus_per_shard=0,
        gpu_class="",
        model_source="tiny",
        arguments="my-server --listen 0.0.0.0:{port} --model '{model}'",
    )
    reconcile()
    (spec,) = orders("a").shards
    assert spec.command == ["my-server", "--listen", f"0.0.0.0:{spec.port}", "--model", "tiny"]


def test_two_shards_on_one_node_get_distinct_ports_and_gpus(db):
    node("a", gpus=8)
    deployment(replicas=2, gpus_per_shard=4)
    reconcile()
    specs = orders("a").shards
    assert len({s.port for s in specs}) == 2
    assert {s.env["CUDA_VISIBLE_DEVICES"] for s in specs} == {"0,1,2,3", "4,5,6,7"}


def test_reports_move_shards_through_starting_to_running_and_write_only_on_change(db, django_assert_num_queries):
    node("a")
    deployment()
    reconcile()
    (spec,) = orders("a").shards
    orders("a", [protocol.ShardStatus(shard=spec.shard, state="starting")])
    assert Replica.objects.get().state == ReplicaState.STARTING
    orders("a", [protocol.ShardStatus(shard=spec.shard, state="running", metrics_port=9100)])
    shard = Shard.objects.get()
    assert (shard.state, shard.metrics_port, shard.replica.state) == (ReplicaState.RUNNING, 9100, ReplicaState.RUNNING)
    # The same report again, twice: one read, then nothing at all from the database.
    same = [protocol.ShardStatus(shard=spec.shard, state="running", metrics_port=9100)]
    with django_assert_num_queries(1):
        orders("a", same)
    with django_assert_num_queries(0):
        assert orders("a", same).shards == [spec]


def test_reports_of_shards_the_node_does_not_hold_change_nothing(db):
    node("a")
    node("b")
    deployment(replicas=2)
    reconcile()
    other = Shard.objects.get(node_id="b")
    orders("a", [protocol.ShardStatus(shard=other.shard_id, state="failed")])
    assert Replica.objects.filter(state=ReplicaState.FAILED).count() == 0


# -- Prometheus' engine targets ------------------------------------------------------------------

# The factory's nodes claim addresses in 10.0.0.0/24 and were never seen registering from
# anywhere: only an approved network makes their claims targets (test_security_targets.py).
trusting_the_fleet_network = override_settings(LLMGW_TRUSTED_TARGET_NETWORKS=(ip_network("10.0.0.0/8"),))


@trusting_the_fleet_network
def test_targets_list_running_shards_with_their_labels(client, db):
    node("a")
    node("b")
    deployment(replicas=2, model_source="/models/m")
    reconcile()
    assert client.get(TARGETS).json() == [], "placed but not running: nothing to scrape yet"
    run_everything()
    groups = client.get(TARGETS).json()
    assert len(groups) == 2
    shards = {s.shard_id: s for s in Shard.objects.select_related("node")}
    for group in groups:
        shard = shards[group["labels"]["shard"]]
        assert group["targets"] == [f"{shard.node.mgmt_addr}:{shard.metrics_port}"]
        assert group["labels"] == {
            "node": shard.node_id,
            "shard": shard.shard_id,
            "replica": shard.replica.replica_id,
            "model": "/models/m",
            "engine": "vllm",
            "served_model": shard.replica.deployment.served_model_name,
        }


@trusting_the_fleet_network
def test_targets_use_a_constant_number_of_queries(client, db, django_assert_num_queries):
    for i in range(6):
        node(f"n{i}")
    deployment(replicas=6)
    reconcile()
    run_everything()
    with django_assert_num_queries(1):
        assert len(client.get(TARGETS).json()) == 6


@override_settings(LLMGW_METRICS_TOKEN="s3cret")
def test_targets_want_the_metrics_token_when_one_is_set(client, db):
    assert client.get(TARGETS).status_code == 401
    assert client.get(TARGETS, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get(TARGETS, HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    assert client.post(TARGETS).status_code == 405


# -- the admin -----------------------------------------------------------------------------------


def test_admin_lists_deployments_with_the_reason_nothing_fits(client, operator):
    node("small", gpus=1)
    deployment("big", gpus_per_shard=4)
    reconcile()
    client.force_login(operator)
    page = client.get("/admin/inventory/deployment/").content.decode()
    assert "Cannot place" in page
    assert "needs 4 × H100-80GB on one node: 1 node has H100-80GB, 1 has 1 free" in page
    big = Deployment.objects.get(name="big")
    detail = client.get(f"/admin/inventory/deployment/{big.pk}/change/").content.decode()
    assert "needs 4 × H100-80GB" in detail and "big-r1" in detail


def test_admin_creates_a_deployment_and_the_reconciler_places_it(client, operator):
    node("a")
    client.force_login(operator)
    response = client.post(
        "/admin/inventory/deployment/add/",
        {
            "name": "demo",
            "model_source": "demo-model",
            "engine": "demo",
            "arguments": "",
            "replicas": "1",
            "shards_per_replica": "1",
            "gpus_per_shard": "0",
            "gpu_class": "",
            "memory_gb_per_shard": "1",
            "cpu_cores_per_shard": "1",
            "replica_set-TOTAL_FORMS": "0",
            "replica_set-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    reconcile()
    assert Replica.objects.get().state == ReplicaState.PLACED


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("arguments", "--flag 'unclosed", "cannot split"),
        ("name", "Bad Name", "lower-case letters"),
        ("gpu_class", "H100-80GB", "needs at least one GPU"),
    ],
)
def test_admin_refuses_a_bad_deployment(client, operator, field, value, message):
    client.force_login(operator)
    data = {
        "name": "x",
        "model_source": "m",
        "engine": "vllm",
        "arguments": "",
        "replicas": "1",
        "shards_per_replica": "1",
        "gpus_per_shard": "0",
        "gpu_class": "",
        "memory_gb_per_shard": "0",
        "cpu_cores_per_shard": "0",
        "replica_set-TOTAL_FORMS": "0",
        "replica_set-INITIAL_FORMS": "0",
        field: value,
    }
    response = client.post("/admin/inventory/deployment/add/", data)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Deployment.objects.exists()


def test_admin_deployments_need_a_login_and_staff(client, viewer):
    assert client.get("/admin/inventory/deployment/").status_code == 302
    client.force_login(viewer)
    assert client.get("/admin/inventory/deployment/").status_code == 302


def test_deleting_a_deployment_frees_its_gpus(client, operator):
    node("a")
    d = deployment(replicas=2)
    reconcile()
    assert GPUClaim.objects.count() == 2
    client.force_login(operator)
    client.post(f"/admin/inventory/deployment/{d.pk}/delete/", {"post": "yes"})
    assert not Deployment.objects.exists()
    assert not Allocation.objects.exists() and not GPUClaim.objects.exists()


def test_a_running_shard_the_agent_no_longer_lists_goes_back_to_placed(db):
    node("a")
    deployment()
    reconcile()
    (spec,) = orders("a").shards
    orders("a", [protocol.ShardStatus(shard=spec.shard, state="running")])
    # The agent restarted and runs nothing yet; it is still told to run the shard.
    assert orders("a", []).shards == [spec]
    shard = Shard.objects.get()
    assert (shard.state, shard.reason) == (ReplicaState.PLACED, "not reported by the agent")
    assert shard.replica.state == ReplicaState.PLACED


def test_a_cached_node_sees_a_new_placement_on_its_next_heartbeat(db, django_assert_num_queries):
    node("a")
    d = deployment()
    reconcile()
    first = orders("a", []).shards
    with django_assert_num_queries(0):
        assert orders("a", []).shards == first
    d.replicas = 2
    d.save()
    reconcile()
    assert len(orders("a", []).shards) == 2


def test_without_redis_every_heartbeat_reads_the_database(db, settings, django_assert_num_queries):
    node("a")
    deployment()
    reconcile()
    with redis_unreachable(settings):
        for _ in range(2):
            with django_assert_num_queries(1):
                assert len(orders("a", []).shards) == 1


def test_setup_demo_creates_a_demo_deployment_once_that_places_on_a_cpu_node(tmp_path, db):
    node("laptop", gpus=0, cpus=8, memory_gb=16)
    for _ in range(2):
        call_command("setup_demo", var_dir=str(tmp_path), stdout=io.StringIO())
    demo = Deployment.objects.get(name="demo")
    assert (demo.name, demo.engine, demo.gpus_per_shard) == ("demo", Engine.DEMO, 0)
    reconcile()
    # The real model's deployment waits for its weights (tests/test_setup_demo.py); the laptop never scanned for any.
    specs = [spec for spec in orders("laptop").shards if spec.engine == Engine.DEMO]
    assert len(specs) == demo.replicas
    for spec in specs:
        assert spec.command[:3] == ["python3", "-m", "agent.demo_engine"]
        assert spec.command[spec.command.index("--port") + 1] == str(spec.port)


def test_a_change_on_one_node_leaves_the_other_nodes_cached(db, django_assert_num_queries):
    node("a")
    node("b")
    d = deployment(replicas=2)
    reconcile()
    a_before, b_before = orders("a", []).shards, orders("b", []).shards
    (b_spec,) = b_before
    orders("b", [protocol.ShardStatus(shard=b_spec.shard, state="running")])
    with django_assert_num_queries(0):
        assert orders("a", []).shards == a_before
    # A deployment's new arguments reach every node.
    d.arguments = "--max-model-len 8192"
    d.save()
    assert orders("a", []).shards[0].command[-2:] == ["--max-model-len", "8192"]
