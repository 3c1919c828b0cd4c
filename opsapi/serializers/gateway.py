"""Tenants and their API keys, as the operators' API shows and takes them."""

from __future__ import annotations

from rest_framework import serializers

from gateway.models import ApiKey, Tenant


class TenantSerializer(serializers.ModelSerializer):
    """A tenant; made with a name (active unless said; no limits unless set). Limits are per gateway; null: none."""

    keys = serializers.IntegerField(source="usable_keys", read_only=True, help_text="Keys not revoked.")

    class Meta:
        model = Tenant
        fields = (
            "name",
            "active",
            "requests_per_second",
            "concurrent_requests",
            "tokens_per_minute",
            "tokens_per_day",
            "created_at",
            "keys",
        )
        read_only_fields = ("created_at",)


class TenantChange(serializers.ModelSerializer):
    """What may change on a tenant: whether it is active, its limits (null: none). Gateways apply it within a second."""

    class Meta:
        model = Tenant
        fields = ("active", "requests_per_second", "concurrent_requests", "tokens_per_minute", "tokens_per_day")
        extra_kwargs = {name: {"required": False} for name in fields}


class KeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    tenant = serializers.CharField(source="tenant.name")
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The key's first characters, to tell it apart; never the key.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField()


class NewKeySerializer(KeySerializer):
    key = serializers.CharField(help_text="The key, shown this once: only its digest is kept.")


class KeyInput(serializers.Serializer):
    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.all())
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class KeyListParams(serializers.Serializer):
    tenant = serializers.CharField(required=False, max_length=64, help_text="Only this tenant's keys.")


def key_fields(key: ApiKey) -> dict:
    return KeySerializer(key).data
