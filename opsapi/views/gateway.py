"""Tenants and API keys of the gateway: listed with read tokens; made and revoked with operate tokens."""

from __future__ import annotations

from django.contrib.admin.models import ADDITION, CHANGE
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.db.models import Count, Q
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.models import ApiKey, Tenant
from opsapi.audit import log_action
from opsapi.auth import require_perm
from opsapi.errors import ErrorSerializer
from opsapi.serializers.gateway import (
    KeyInput,
    KeyListParams,
    KeySerializer,
    NewKeySerializer,
    TenantChange,
    TenantSerializer,
    key_fields,
)
from opsapi.views.base import REFUSALS, OpsView, body, params

TENANT_NAME = OpenApiParameter("name", str, OpenApiParameter.PATH, description="The tenant's name.")
KEY_ID = OpenApiParameter("key_id", int, OpenApiParameter.PATH, description="The key's id.")


def valid(instance) -> None:
    try:
        instance.full_clean()
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from None


class TenantList(OpsView):
    @extend_schema(operation_id="tenants_list", responses={200: TenantSerializer(many=True), **REFUSALS})
    def get(self, request: Request) -> Response:
        tenants = Tenant.objects.annotate(usable_keys=Count("keys", filter=Q(keys__revoked_at__isnull=True)))
        return Response(TenantSerializer(tenants, many=True).data)

    @extend_schema(
        operation_id="tenants_create", request=TenantSerializer, responses={201: TenantSerializer, **REFUSALS}
    )
    def post(self, request: Request) -> Response:
        require_perm(request, "gateway.add_tenant")
        tenant = Tenant(**body(TenantSerializer, request))
        valid(tenant)
        with transaction.atomic():
            tenant.save()
            log_action(request.auth, tenant, ADDITION, "created")
        tenant.usable_keys = 0
        return Response(TenantSerializer(tenant).data, status=201)


def tenant_named(name: str) -> Tenant:
    tenant = Tenant.objects.annotate(usable_keys=Count("keys", filter=Q(keys__revoked_at__isnull=True)))
    found = tenant.filter(name=name).first()
    if found is None:
        raise NotFound(f"no tenant {name}")
    return found


class TenantDetail(OpsView):
    @extend_schema(
        operation_id="tenants_read",
        parameters=[TENANT_NAME],
        responses={200: TenantSerializer, 404: ErrorSerializer, **REFUSALS},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(TenantSerializer(tenant_named(name)).data)

    @extend_schema(
        operation_id="tenants_change",
        parameters=[TENANT_NAME],
        request=TenantChange,
        responses={200: TenantSerializer, 404: ErrorSerializer, **REFUSALS},
        summary="Change a tenant's limits or whether it is active: the gateways apply it within a second",
    )
    def patch(self, request: Request, name: str) -> Response:
        require_perm(request, "gateway.change_tenant")
        tenant = tenant_named(name)
        changes = body(TenantChange, request)
        for field, value in changes.items():
            setattr(tenant, field, value)
        valid(tenant)
        with transaction.atomic():
            tenant.save(update_fields=list(changes))
            told = ", ".join(f"{field} {value}" for field, value in sorted(changes.items()))
            log_action(request.auth, tenant, CHANGE, f"changed: {told}" if told else "unchanged")
        return Response(TenantSerializer(tenant).data)


class KeyList(OpsView):
    @extend_schema(
        operation_id="keys_list", parameters=[KeyListParams], responses={200: KeySerializer(many=True), **REFUSALS}
    )
    def get(self, request: Request) -> Response:
        asked = params(KeyListParams, request)
        keys = ApiKey.objects.select_related("tenant")
        if asked.get("tenant"):
            keys = keys.filter(tenant__name=asked["tenant"])
        return Response([key_fields(k) for k in keys])

    @extend_schema(
        operation_id="keys_create",
        request=KeyInput,
        responses={201: NewKeySerializer, **REFUSALS},
        summary="Make a key for a tenant; the answer holds the key, shown this once",
    )
    def post(self, request: Request) -> Response:
        require_perm(request, "gateway.add_apikey")
        key = ApiKey(**body(KeyInput, request))
        valid(key)
        with transaction.atomic():
            secret = key.issue()
            key.save()
            log_action(request.auth, key, ADDITION, f"key {key.prefix}… made for tenant {key.tenant.name}")
        return Response({**key_fields(key), "key": secret}, status=201)


class KeyDetail(OpsView):
    @extend_schema(
        operation_id="keys_revoke",
        parameters=[KEY_ID],
        responses={200: KeySerializer, 404: ErrorSerializer, **REFUSALS},
        summary="Revoke a key: the gateways refuse it within a second",
    )
    def delete(self, request: Request, key_id: int) -> Response:
        require_perm(request, "gateway.change_apikey")
        key = ApiKey.objects.select_related("tenant").filter(pk=key_id).first()
        if key is None:
            raise NotFound(f"no key {key_id}")
        with transaction.atomic():
            if key.revoke(request.user.get_username()):
                log_action(request.auth, key, CHANGE, "revoked")
        return Response(key_fields(key))
