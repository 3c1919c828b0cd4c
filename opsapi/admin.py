"""API tokens in the admin: staff see every user's and revoke them; each makes tokens for themselves.

Only a superuser may make a token for someone else, and a secret is shown only
to the token's owner: a staff user who could make (or read) another user's
token would act as that user, a superuser included, with one permission.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import get_user_model

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

    def get_changeform_initial_data(self, request) -> dict:
        return {"user": request.user.pk, **super().get_changeform_initial_data(request)}

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        # The form refuses any other owner ("select a valid choice"), whatever the POST says.
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj: ApiToken, form, change: bool) -> None:
        if change:
            return
        secret = obj.issue()
        super().save_model(request, obj, form, change)
        if obj.user_id == request.user.pk:
            messages.warning(request, f"Token for {obj.user}: {secret} — copy it now, it is not shown again.")
        else:
            messages.warning(
                request,
                f"Token {obj.label} made for {obj.user}. Only a token's owner may see its secret, so it is shown"
                f" to nobody: {obj.user} makes their own on the Tokens page; revoke this one if it is not wanted.",
            )

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        revoked = sum(token.revoke(request.user.get_username()) for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)
