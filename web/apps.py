from django.apps import AppConfig


class WebConfig(AppConfig):
    """The web app: the agent API, the pages, /metrics and the tokens agents hold.

    Its label stays "nodes", the app's name before it was called what it is, so its
    tables (nodes_jointoken, nodes_nodetoken) and migration history stay as they are.
    """

    name = "web"
    label = "nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Keeps the heartbeat path's cached node cards current: connected here, by
        # name, rather than by the side effect of importing a module.
        from web.api import cards

        cards.connect_receivers()
