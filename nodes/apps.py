from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Keeps the heartbeat path's cached node cards current: connected here, by
        # name, rather than by the side effect of importing a module.
        from nodes.api import cards

        cards.connect_receivers()
