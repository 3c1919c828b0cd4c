"""Operator actions from the node page: cordon, drain and uncordon, through the same operation as the admin."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from inventory.models import Node
from inventory.operator import ACTIONS, ReasonRequired, set_admin_state
from nodes.views.access import login_required
from nodes.views.node import valid_id

MAX_REASON = 2000


@require_POST
@login_required
def set_node_admin_state(request, node_id: str):
    if not request.user.has_perm("inventory.change_node"):
        return HttpResponseForbidden("Only operators may change a node's admin state.")
    if not valid_id(node_id):
        raise Http404("no such node")
    node = get_object_or_404(Node, pk=node_id)
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")[:MAX_REASON]
    if action not in ACTIONS:
        messages.error(request, "Unknown action.")
        return redirect(node)
    try:
        changed = set_admin_state(node, ACTIONS[action], request.user, reason)
    except ReasonRequired:
        messages.error(request, f"{action.capitalize()} needs a reason: the next operator will want to know why.")
        return redirect(node)
    if changed:
        messages.success(request, f"{node.pk}: {action} done.")
    else:
        messages.info(request, f"{node.pk} was already {ACTIONS[action].label}.")
    return redirect(node)
