"""What the gateway should serve, read from the inventory: one backend per deployment, a server per ready replica.

A replica serves when it is running, every shard of it runs on a node that is alive and
active (cordoned, draining, unreachable and lost nodes take their servers out), and none of
its GPUs has failed. Its shard 0's engine takes the requests (the other shards of a
multi-node replica join it). At most eight queries, whatever the fleet's size.
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Exists, OuterRef

from agent import enginekinds
from gateway import budgets
from gateway.haproxy_config import Backend, Desired, Server
from gateway.models import ApiKey, Tenant
from inventory.endpoints import trusted_address
from inventory.models import GPU, Deployment, GPUCondition, Node, ReplicaState, Shard


def running_usage(engine: str) -> str:
    kind = enginekinds.BY_NAME.get(engine)
    return kind.running_usage if kind is not None else ""


def read() -> Desired:
    failed_gpus = set(GPU.objects.filter(condition=GPUCondition.FAILED).values_list("node_id", "index"))
    # "Alive and active" is the schedulable rule, from its one home.
    schedulable = Exists(Node.objects.schedulable().filter(pk=OuterRef("node_id")))
    shards = (
        Shard.objects.filter(replica__state=ReplicaState.RUNNING)
        .annotate(node_serves=schedulable)
        .values_list(
            "replica__replica_id",
            "replica__deployment_id",
            "index",
            "state",
            "port",
            "gpu_indices",
            "node_id",
            "node__mgmt_addr",
            "node__source_addr",
            "node_serves",
        )
    )
    leaders: dict[str, tuple[int, str, str | None, int]] = {}
    broken: set[str] = set()
    for replica, deployment, index, state, port, gpus, node, claimed, source, node_serves in shards:
        healthy = node_serves and state == ReplicaState.RUNNING and not any((node, gpu) in failed_gpus for gpu in gpus)
        if not healthy:
            broken.add(replica)
        elif index == 0:
            leaders[replica] = (deployment, replica, trusted_address(claimed, source), port)
    deployments = list(
        Deployment.objects.values_list(
            "pk", "served_model_name", "engine_secret", "prefix_affinity", "engine", "max_in_flight_per_replica"
        )
    )
    # Each server's maxconn: past it the gateway queues, tenants under their fair share first (gateway.fairness).
    maxconn = {pk: limit or 0 for pk, *_, limit in deployments}
    servers: dict[int, list[Server]] = defaultdict(list)
    for replica, (deployment, name, address, port) in sorted(leaders.items()):
        # The address the control plane trusts, never the node's claim (inventory/endpoints.py);
        # HAProxy's Runtime API takes an IPv6 address without its brackets.
        if replica not in broken and address and port:
            server = Server(name=name, address=address.strip("[]"), port=port, maxconn=maxconn.get(deployment, 0))
            servers[deployment].append(server)
    backends = {
        served: Backend(served, secret, tuple(servers.get(pk, ())), affinity, running_usage(engine))
        for pk, served, secret, affinity, engine, _ in deployments
    }
    keys = dict(ApiKey.objects.usable().values_list("digest", "tenant__name"))
    limits = Tenant.objects.filter(active=True).values_list("name", "requests_per_second", "concurrent_requests")
    return Desired(
        backends=backends,
        keys=keys,
        requests_per_second={name: str(rps) for name, rps, _ in limits if rps is not None},
        concurrent_requests={name: str(cur) for name, _, cur in limits if cur is not None},
        budget_spent=budgets.spent(),
    )
