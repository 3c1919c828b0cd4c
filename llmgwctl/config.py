"""Where `llmgw login` keeps the control plane's URL and the token: readable by the user only."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


class NotLoggedIn(Exception):
    pass


@dataclass
class Login:
    url: str
    token: str
    # The CA that signs the control plane's certificate (empty: the system's), and plain http:// to a host
    # other than loopback, allowed only by name (llmgw login --ca-file, --allow-insecure-http).
    ca_file: str = ""
    allow_insecure_http: bool = False


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw"


def config_file() -> Path:
    return config_dir() / "config.json"


def save(login: Login) -> Path:
    """Write the login, created 0600 inside a 0700 directory: the token acts as its owner."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_file()
    temporary = path.with_suffix(".tmp")
    # Created with its final mode, so the token is never readable by others, not even for a moment.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(login), handle)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)
    return path


def load() -> Login:
    """The login: LLMGW_URL and LLMGW_TOKEN from the environment win over the saved one."""
    url, token = os.environ.get("LLMGW_URL", ""), os.environ.get("LLMGW_TOKEN", "")
    saved = {}
    if not (url and token):
        try:
            saved = json.loads(config_file().read_text())
        except FileNotFoundError:
            saved = {}
        except (OSError, ValueError) as exc:
            raise NotLoggedIn(f"cannot read {config_file()}: {exc}") from None
        url, token = url or saved.get("url", ""), token or saved.get("token", "")
    if not url or not token:
        raise NotLoggedIn("not logged in: run `llmgw login URL` first")
    return Login(
        url=url.rstrip("/"),
        token=token,
        ca_file=os.environ.get("LLMGW_CA_FILE") or saved.get("ca_file", ""),
        allow_insecure_http=saved.get("allow_insecure_http") is True,
    )
