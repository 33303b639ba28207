"""Small networking helpers for local launches."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (never a hard-coded port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
