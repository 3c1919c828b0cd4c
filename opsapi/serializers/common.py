"""Fields and checks every part of the API shares."""

from __future__ import annotations

from rest_framework import serializers

from nodes.filtersets import MAX_TEXT

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def no_nul(value: str) -> str:
    # PostgreSQL refuses NUL in text, and nothing we store contains one.
    if "\x00" in value:
        raise serializers.ValidationError("must not contain NUL")
    return value


class Text(serializers.CharField):
    """A short text parameter, as the pages accept it."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_blank", True)
        kwargs.setdefault("default", "")
        kwargs.setdefault("max_length", MAX_TEXT)
        kwargs.setdefault("validators", [no_nul])
        super().__init__(**kwargs)


class PageParams(serializers.Serializer):
    page = serializers.IntegerField(required=False, default=1, min_value=1, max_value=1_000_000)
    page_size = serializers.IntegerField(
        required=False, default=DEFAULT_PAGE_SIZE, min_value=1, max_value=MAX_PAGE_SIZE
    )


class PagedSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Matching items in all pages.")
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    page_size = serializers.IntegerField()
    next = serializers.IntegerField(allow_null=True, help_text="The next page's number; null on the last page.")
    previous = serializers.IntegerField(allow_null=True)


def paging(count: int, page: int, page_size: int) -> dict:
    pages = max(-(-count // page_size), 1)
    return {
        "count": count,
        "page": page,
        "pages": pages,
        "page_size": page_size,
        "next": page + 1 if page < pages else None,
        "previous": page - 1 if 1 < page <= pages + 1 else None,
    }
