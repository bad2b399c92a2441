"""Listening sockets that a launcher binds and hands to the HTTP servers it starts.

``fluidpd up`` binds the router's and every sidecar's port itself, before it starts them, and
each child serves on the socket it inherited (the same idea as systemd's socket activation).
A port is then held from the moment it is chosen: a port in use is one clear error before
anything starts, ``--port 0`` can mean "any free port", and no other process can take a port
between the launcher choosing it and the child binding it (a child that lost that race used to
exit while another program's server answered the launcher's health checks in its place)."""

from __future__ import annotations

import os
import socket

#: The inherited listening socket's descriptor number, set by the launcher for one child.
ENV = "FLUIDPD_LISTEN_FD"


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: a free one). Raises ``OSError``
    (e.g. address in use) with the address in its message."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn binds: a restarted server may reuse a port whose old connections linger.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{host}:{port}: {exc.strerror}") from None
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def handoff_env(sock: socket.socket) -> dict[str, str]:
    """What a child needs in its environment to serve on ``sock`` (pass its fd too)."""
    return {ENV: str(sock.fileno())}


def inherited() -> socket.socket | None:
    """The listening socket this process was handed, if any. The variable is removed, so
    what this process starts in turn does not take the descriptor for its own."""
    fd = os.environ.pop(ENV, None)
    if fd is None:
        return None
    try:
        return socket.socket(fileno=int(fd))
    except (ValueError, OSError) as exc:
        raise SystemExit(f"{ENV}={fd}: not an inherited socket ({exc})") from None
