from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the receivers that keep the heartbeat path's cached node cards current.
        from nodes.api import cards  # noqa: F401
