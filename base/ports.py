"""TCP ports a harvest process binds: one check, one error naming the flag that chose the port."""

import socket

from base.errors import HarvestError


def bind_port(host: str, port: int, flag: str) -> socket.socket:
    """A TCP socket bound to host:port (SO_REUSEADDR, as servers bind), or the flag's one-line error."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise HarvestError(f"{flag} {port} on {host} is not available: {e.strerror}") from None
    return sock


def check_port_free(host: str, port: int, flag: str) -> None:
    bind_port(host, port, flag).close()
