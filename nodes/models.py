"""The agent API's credentials: join tokens that let a node register, and per-node tokens.

Only a SHA-256 digest of each secret is stored; the secret is shown once, when
it is made. The secrets are 256 random bits, so a fast digest is enough: there
is nothing to guess by brute force. Digests are compared with
`hmac.compare_digest`, so a wrong guess takes as long whatever its prefix.

A token is `<lookup>.<secret>`: the part before the last dot finds the row (a
join token's key, a node's id), the secret after it proves the bearer. The
secret is URL-safe base64, which has no dots, so a node id with dots in it is
still split right.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.db import models
from django.utils import timezone

from inventory.models import Node, NodeEvent


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def digest_matches(secret: str, expected: str) -> bool:
    """Constant-time comparison; an empty expected digest (revoked) never matches."""
    return bool(expected) and hmac.compare_digest(digest(secret), expected)


def split_token(token: str) -> tuple[str, str]:
    """(lookup, secret), or ("", "") for anything that is not a token."""
    lookup, dot, secret = token.rpartition(".")
    if not dot or not lookup or not secret:
        return "", ""
    return lookup, secret


def new_secret() -> str:
    return secrets.token_urlsafe(32)


class JoinTokenQuerySet(models.QuerySet):
    def usable(self):
        return self.filter(revoked_at__isnull=True)


class JoinToken(models.Model):
    """A token a new node presents to register, made and revoked in the admin.

    The cluster-wide LLMGW_JOIN_TOKEN works beside these; it is revoked by
    changing the setting.
    """

    key = models.CharField(max_length=16, unique=True, editable=False)
    secret_digest = models.CharField(max_length=64, editable=False)
    name = models.CharField(max_length=200, help_text="What this token is for, e.g. the rack or the batch of machines.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.CharField(max_length=150, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = JoinTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.key})"

    def issue(self) -> str:
        """Give this (unsaved) token its key and secret; returns the token, to show once."""
        self.key = secrets.token_hex(8)
        secret = new_secret()
        self.secret_digest = digest(secret)
        return f"{self.key}.{secret}"

    def revoke(self) -> bool:
        if self.revoked_at is not None:
            return False
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
        return True

    @classmethod
    def find(cls, token: str) -> JoinToken | None:
        """The usable join token this is, if any."""
        key, secret = split_token(token)
        if len(key) != 16 or not key.isalnum():
            return None
        join_token = cls.objects.usable().filter(key=key).first()
        if join_token is None or not digest_matches(secret, join_token.secret_digest):
            return None
        return join_token


class NodeToken(models.Model):
    """The one token a node heartbeats with. Registering again replaces it.

    Revoking empties the digest, so no secret matches until the node registers
    again with a join token.
    """

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="token")
    secret_digest = models.CharField(max_length=64, blank=True, editable=False)
    issued_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)

    def __str__(self) -> str:
        return f"token of {self.node_id}"

    @property
    def revoked(self) -> bool:
        return not self.secret_digest

    @classmethod
    def issue(cls, node: Node, first: bool = False) -> str:
        """Make a new token for the node, replacing any other; returns it, to show once.

        `first`: the node was created in this transaction, so it has no token
        yet and one INSERT does (update_or_create costs a savepoint and a locking read more).
        """
        secret = new_secret()
        fields = {"secret_digest": digest(secret), "issued_at": timezone.now(), "revoked_at": None, "revoked_by": ""}
        if first:
            cls.objects.create(node=node, **fields)
        else:
            cls.objects.update_or_create(node=node, defaults=fields)
        return f"{node.pk}.{secret}"

    def revoke(self, actor: str) -> bool:
        """Refuse the node's heartbeats from now on; recorded as an event of the node."""
        if self.revoked:
            return False
        self.secret_digest = ""
        self.revoked_at = timezone.now()
        self.revoked_by = actor
        self.save(update_fields=["secret_digest", "revoked_at", "revoked_by"])
        NodeEvent.objects.create(
            node_id=self.node_id,
            at=self.revoked_at,
            kind=NodeEvent.Kind.REGISTRATION,
            reason="node token revoked",
            actor=actor,
        )
        return True
