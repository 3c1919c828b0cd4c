"""Security headers Django 5.2 does not send by itself.

The Content-Security-Policy allows scripts only from our own origin, so an agent
that reports `<script>` as its hostname cannot run it even where a template
forgot to escape. Styles may be inline: the admin and htmx's indicator use
style attributes, and a style cannot run code.
"""

from django.conf import settings

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class SecurityHeadersMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Referrer-Policy", settings.SECURE_REFERRER_POLICY or "same-origin")
        response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        return response
