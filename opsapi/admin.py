"""API tokens in the admin: staff see every user's, make them for a user (shown once) and revoke them."""

from __future__ import annotations

from django.contrib import admin, messages

from opsapi.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "key", "scope", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("scope", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "key", "user__username")
    list_select_related = ("user",)
    actions = ("revoke",)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("user", "name", "scope", "expires_at")
        return ("user", "name", "key", "scope", "created_at", "expires_at", "last_used_at", "revoked_at", "revoked_by")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        # A token's owner and power are fixed once it exists: make a new one instead.
        return self.get_fields(request, obj)

    def save_model(self, request, obj: ApiToken, form, change: bool) -> None:
        if change:
            return
        secret = obj.issue()
        super().save_model(request, obj, form, change)
        messages.warning(request, f"Token for {obj.user}: {secret} — copy it now, it is not shown again.")

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        revoked = sum(token.revoke(request.user.get_username()) for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)
