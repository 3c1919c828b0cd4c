"""Tells drf-spectacular how our tokens authenticate, so the document declares bearer auth."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "opsapi.auth.TokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token, made on the Tokens page (`llmgw-ops-…`).",
        }
