"""The development stack's certificate authority, and the certificate HAProxy serves HTTPS with.

Made once under var/tls/ with the openssl command (installed wherever HAProxy
is), then reused, so an agent configured to trust var/tls/ca.pem keeps trusting
it across restarts. Every key is written by openssl under umask 077, so no key
is readable by others at any moment, and the directory is the owner's only.
The CA signs for loopback and this machine's name; nothing else trusts it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lib.private_files import write_private

CA_DAYS = 3650
# Browsers refuse server certificates valid for longer than 825 days.
SERVER_DAYS = 825
CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Tls:
    directory: Path

    @property
    def ca(self) -> Path:
        """The authority's certificate: what a client of the stack trusts (the agent's `ca_file`)."""
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def proxy_pem(self) -> Path:
        """HAProxy's `crt`: the server certificate followed by its key."""
        return self.directory / "proxy.pem"


def openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError("openssl is not installed: apt-get install openssl (make run installs it)")
    subprocess.run([binary, *args], check=True, capture_output=True, umask=0o077, timeout=60)


def server_names() -> list[str]:
    names = ["DNS:localhost", "IP:127.0.0.1", "IP:::1"]
    host = socket.gethostname()
    if host and host != "localhost":
        names.append(f"DNS:{host}")
    return names


def ensure(var: Path) -> Tls:
    """The stack's CA and HAProxy's certificate under var/tls/, made if absent."""
    tls = Tls(var / "tls")
    tls.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(tls.directory, 0o700)
    if tls.ca.exists() and tls.ca_key.exists() and tls.proxy_pem.exists():
        return tls
    directory = tls.directory
    openssl(
        "req", "-x509", *CURVE, "-keyout", str(tls.ca_key), "-out", str(tls.ca), "-days", str(CA_DAYS),
        "-subj", "/CN=llmgw development CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    key, request, certificate = directory / "proxy.key", directory / "proxy.csr", directory / "proxy.crt"
    extensions = directory / "proxy.ext"
    extensions.write_text(
        f"subjectAltName={','.join(server_names())}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl("req", *CURVE, "-keyout", str(key), "-out", str(request), "-subj", "/CN=localhost")
    openssl(
        "x509", "-req", "-in", str(request), "-CA", str(tls.ca), "-CAkey", str(tls.ca_key), "-CAcreateserial",
        "-out", str(certificate), "-days", str(SERVER_DAYS), "-extfile", str(extensions),
    )  # fmt: skip
    write_private(tls.proxy_pem, certificate.read_text() + key.read_text())
    for leftover in (key, request, certificate, extensions, directory / "ca.srl"):
        leftover.unlink(missing_ok=True)
    return tls
