"""The admin for the agent API's credentials: make and revoke join tokens, revoke node tokens.

A secret is shown once, in the message after it is made; only its digest is kept.
"""

from __future__ import annotations

from django.contrib import admin, messages

from inventory.models import actor_name
from nodes.models import JoinToken, NodeToken


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "key", "created_at", "created_by", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "key")
    fields = ("name", "key", "created_at", "created_by", "last_used_at", "revoked_at")
    readonly_fields = ("key", "created_at", "created_by", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def has_delete_permission(self, request, obj=None):
        # Revoked tokens stay, so the registrations they made can still be traced.
        return False

    def save_model(self, request, obj: JoinToken, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        obj.created_by = actor_name(request.user)
        token = obj.issue()
        super().save_model(request, obj, form, change)
        messages.warning(
            request,
            f"Join token for “{obj.name}”: {token} — copy it now; it is not stored and will not be shown again.",
        )

    @admin.action(description="Revoke the selected join tokens", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = sum(token.revoke() for token in queryset)
        self.message_user(request, f"{revoked} join token(s) revoked.", messages.SUCCESS)


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    list_display = ("node", "issued_at", "revoked_at", "revoked_by")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("node__id",)
    fields = ("node", "issued_at", "revoked_at", "revoked_by")
    readonly_fields = fields
    list_select_related = ("node",)
    actions = ("revoke",)

    def has_add_permission(self, request):
        # A node gets its token by registering with a join token.
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected node tokens (the nodes must register again)", permissions=["change"])
    def revoke(self, request, queryset):
        actor = actor_name(request.user)
        revoked = sum(token.revoke(actor) for token in queryset)
        self.message_user(request, f"{revoked} node token(s) revoked.", messages.SUCCESS)
