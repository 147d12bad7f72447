"""What --sglang-url may name: a server's root, http(s) with a host. Checked at the session's start and on attach."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pytest_sglang.errors import ProfileError


@dataclass(frozen=True)
class ServerRoot:
    root: str  # scheme://host:port, no path
    host: str
    port: int


def server_root(url: str) -> ServerRoot:
    """The root ``url`` names; ProfileError saying what to pass instead when it is no server root."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    if parts.scheme not in ("http", "https") or not parts.hostname or not port:
        raise ProfileError(f"--sglang-url={url!r} is not an http(s) URL such as http://127.0.0.1:30000: give the "
                           "root of the running server, scheme, host and port.")
    root = f"{parts.scheme}://{parts.netloc}"
    if parts.path.strip("/") or parts.query:
        raise ProfileError(
            f"--sglang-url={url} has a path ({parts.path}): give the server's root, --sglang-url={root}; the "
            "plugin adds /v1/completions, /health and the other paths itself.")
    return ServerRoot(root=root, host=parts.hostname, port=port)
