"""Listening sockets of a run: bound where they must be, on ports that cannot be lost.

torch.distributed's TCP store (rank 0 hosts it; peers read and write keys without any
authentication) binds every interface when torch creates it. Here the store of a group this
project starts itself (`verl_mp.engine.runtime.init_distributed` outside torchrun: a world of
one, Ray rank groups) listens on one address only: loopback when every rank runs on this
machine, else the address ``MASTER_ADDR`` names. `reserve_port` keeps the chosen port bound
from the moment it is picked until the store takes the socket over, so no other process can
take it in between (``free_port``'s pick-and-release race).

``python -m verl_mp.utils.net [HOST]`` prints a port free on HOST (default: every interface),
for launch scripts.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys

_RESERVED: dict[int, socket.socket] = {}  # port -> a listening socket this process holds


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_address(host: str) -> str:
    """The local address a listener for ``host`` binds: ``host`` itself (resolved), never a
    wildcard."""
    if host in ("", "0.0.0.0", "::"):
        raise ValueError(f"MASTER_ADDR={host!r} is a wildcard; name the address rank 0 listens on")
    return "127.0.0.1" if host == "localhost" else socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]


def _listener(host: str, port: int) -> socket.socket:
    address = bind_address(host)
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen on {address}:{port} ({err.strerror}); is MASTER_ADDR="
                                 f"{host} an address of this machine, and the port free?") from None
    sock.listen(1024)
    return sock


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port on ``host``'s address that this process keeps listening on until
    `create_store` (in this process) takes the socket over."""
    sock = _listener(host, 0)
    port = sock.getsockname()[1]
    _RESERVED[port] = sock
    return port


def free_port(host: str = "") -> int:
    """A port free right now on ``host`` ('' = every interface), released at once: for
    launchers whose listener is another program's (torchrun's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def create_store(host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta):
    """The TCP store of a process group: rank 0 serves it on ``host``'s address only (the
    socket `reserve_port` kept, if this process reserved ``port``); the others connect."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout)
    sock = _RESERVED.pop(port, None) or _listener(host, port)
    fd = os.dup(sock.fileno())  # the store owns its copy; ours closes now
    sock.close()
    return dist.TCPStore(host, port, world_size, True, timeout=timeout, master_listen_fd=fd)


if __name__ == "__main__":
    print(free_port(sys.argv[1] if len(sys.argv) > 1 else ""))
