"""Tenants and API keys in the admin: keys are made for a tenant (the key shown once) and revoked; usage is read."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, Q

from gateway.models import ApiKey, Tenant, Usage


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ("prefix", "name", "created_at", "expires_at", "revoked_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        # Made on the key's own page, where its secret can be shown once.
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "active",
        "requests_per_second",
        "concurrent_requests",
        "tokens_per_minute",
        "tokens_per_day",
        "usable_keys",
        "created_at",
    )
    list_filter = ("active",)
    search_fields = ("name",)
    inlines = (ApiKeyInline,)

    def get_queryset(self, request):
        usable = Q(keys__revoked_at__isnull=True)
        return super().get_queryset(request).annotate(usable=Count("keys", filter=usable))

    @admin.display(description="keys not revoked")
    def usable_keys(self, tenant) -> int:
        return tenant.usable


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "tenant", "name", "created_at", "expires_at", "revoked_at")
    list_filter = ("tenant", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("prefix", "name", "tenant__name")
    list_select_related = ("tenant",)
    actions = ("revoke",)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "name", "expires_at")
        return ("tenant", "name", "prefix", "created_at", "expires_at", "revoked_at", "revoked_by")

    def get_readonly_fields(self, request, obj=None):
        # A key's tenant is fixed once it exists: make a new one instead.
        return () if obj is None else ("tenant", "prefix", "created_at", "revoked_at", "revoked_by")

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        secret = obj.issue()
        super().save_model(request, obj, form, change)
        messages.warning(request, f"API key for {obj.tenant}: {secret} — copy it now, it is not shown again.")

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        revoked = sum(key.revoke(request.user.get_username()) for key in queryset)
        self.message_user(request, f"{revoked} key(s) revoked.", messages.SUCCESS)


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    """What the gateways recorded, by the hour: read here, never written (the syncs write it)."""

    list_display = ("hour", "tenant", "model", "replica", "requests", "prompt_tokens", "completion_tokens")
    list_filter = ("tenant", "model")
    date_hierarchy = "hour"
    ordering = ("-hour", "tenant", "model", "replica")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
