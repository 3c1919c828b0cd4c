"""The gateway: tenants and their API keys, and the control plane's side of the data plane.

HAProxy serves the OpenAI API (deploy/gateway.cfg); this app holds who may use it and
programs HAProxy with what should be (`gateway.sync`), never standing in a request's path.
"""
