"""Deployments: listed with replicas and shards, created, scaled and deleted through operate tokens."""

from __future__ import annotations

from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from inventory.models import Deployment
from opsapi.audit import log_action
from opsapi.auth import may, require_perm
from opsapi.deployments import deployment_fields, deployments
from opsapi.errors import ErrorSerializer
from opsapi.serializers.common import PageParams, paging
from opsapi.serializers.deployments import (
    DeploymentInput,
    DeploymentListSerializer,
    DeploymentSerializer,
    ScaleInput,
)
from opsapi.views.base import REFUSALS, OpsView, body, params

NAME = OpenApiParameter("name", str, OpenApiParameter.PATH, description="The deployment's name.")


def one(name: str) -> Deployment:
    found = deployments().filter(name=name).first() if "\x00" not in name else None
    if found is None:
        raise NotFound(f"no deployment {name!r}")
    return found


CHANGE_DEPLOYMENT = "inventory.change_deployment"


def answer(request: Request, name: str, status: int = 200) -> Response:
    fields = deployment_fields(one(name), may(request, CHANGE_DEPLOYMENT))
    return Response(DeploymentSerializer(fields).data, status=status)


class DeploymentList(OpsView):
    @extend_schema(
        operation_id="deployments_list",
        parameters=[PageParams],
        responses={200: DeploymentListSerializer, **REFUSALS},
        summary="Deployments with their replicas, shards, and why a replica is not placed",
    )
    def get(self, request: Request) -> Response:
        asked = params(PageParams, request)
        page, size = asked["page"], asked["page_size"]
        every = deployments()
        count = every.count()
        may_change = may(request, CHANGE_DEPLOYMENT)
        rows = [deployment_fields(d, may_change) for d in every[(page - 1) * size : page * size]]
        return Response(DeploymentListSerializer({**paging(count, page, size), "results": rows}).data)

    @extend_schema(
        operation_id="deployments_create",
        request=DeploymentInput,
        responses={201: DeploymentSerializer, **REFUSALS},
        summary="Create a deployment; the reconciler places its replicas",
    )
    def post(self, request: Request) -> Response:
        require_perm(request, "inventory.add_deployment")
        deployment = Deployment(**body(DeploymentInput, request))
        try:
            deployment.full_clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        with transaction.atomic():
            deployment.save()
            log_action(request.auth, deployment, ADDITION, f"created with {deployment.replicas} replicas")
        return answer(request, deployment.name, status=201)


class DeploymentDetail(OpsView):
    @extend_schema(
        operation_id="deployments_retrieve",
        parameters=[NAME],
        responses={200: DeploymentSerializer, 404: ErrorSerializer, **REFUSALS},
        summary="One deployment",
    )
    def get(self, request: Request, name: str) -> Response:
        return answer(request, name)

    @extend_schema(
        operation_id="deployments_scale",
        parameters=[NAME],
        request=ScaleInput,
        responses={200: DeploymentSerializer, 404: ErrorSerializer, **REFUSALS},
        summary="Scale: change the number of replicas wanted",
    )
    def patch(self, request: Request, name: str) -> Response:
        require_perm(request, CHANGE_DEPLOYMENT)
        wanted = body(ScaleInput, request)["replicas"]
        deployment = one(name)
        with transaction.atomic():
            old = deployment.replicas
            deployment.replicas = wanted
            deployment.save(update_fields=["replicas"])
            log_action(request.auth, deployment, CHANGE, f"scaled from {old} to {wanted} replicas")
        return answer(request, name)

    @extend_schema(
        operation_id="deployments_destroy",
        parameters=[NAME],
        responses={204: None, 404: ErrorSerializer, **REFUSALS},
        summary="Delete a deployment; its replicas' GPUs and memory are freed at once",
    )
    def delete(self, request: Request, name: str) -> Response:
        require_perm(request, "inventory.delete_deployment")
        deployment = one(name)
        with transaction.atomic():
            log_action(request.auth, deployment, DELETION, "deleted")
            deployment.delete()
        return Response(status=204)
