from django.apps import AppConfig


class OpsApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "opsapi"
    verbose_name = "Operators' API"

    def ready(self) -> None:
        # Registers the token scheme with drf-spectacular.
        from opsapi import schema  # noqa: F401
