"""Small networking helpers for local launches."""

import socket


def free_port(host: str = "") -> int:
    """A TCP port that is free right now on ``host`` (default: every interface, so it is
    also free on the node address rank 0 will listen on); never a hard-coded port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
