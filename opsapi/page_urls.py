"""The Tokens page, beside the other operator pages."""

from django.urls import path

from opsapi import pages

urlpatterns = [
    path("tokens/", pages.tokens, name="opsapi-tokens"),
    path("tokens/<str:key>/revoke/", pages.revoke, name="opsapi-token-revoke"),
]
