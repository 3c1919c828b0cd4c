from django.apps import AppConfig


class NodesConfig(AppConfig):
    """The web app: the agent API, the pages, /metrics and the tokens agents hold.

    Folder and label are both "nodes", so its tables (nodes_jointoken,
    nodes_nodetoken) and migration history are the ones it always had.
    """

    name = "nodes"
    label = "nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Keeps the heartbeat path's cached node cards current: connected here, by
        # name, rather than by the side effect of importing a module.
        from nodes.api import cards

        cards.connect_receivers()
