"""Which address and interface to use between hosts (the kernel and the ranks use the same rules).

With ranks on several hosts, everything jdist opens listens on one chosen address, never on all
interfaces, and gloo/NCCL are told the interface that reaches rank 0. The route is asked of
the operating system without sending anything (:func:`route_source`: a UDP socket that is only
connected), so a hostname that resolves to ``127.0.1.1`` (Debian's default) never decides it.

Example:
    >>> route_source("127.0.0.1")
    '127.0.0.1'
    >>> interface_of("127.0.0.1")
    'lo'
    >>> is_loopback("127.0.1.1"), is_loopback("198.18.0.1")
    (True, False)
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> str:
    """The IPv4 address of ``host`` (an address is returned as it is); OSError if it has none."""
    return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]


def route_source(addr: str) -> str:
    """This machine's address that the route to ``addr`` leaves from (nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


def interface_of(addr: str) -> str | None:
    """The name of this machine's interface that holds ``addr`` (None: no interface has it)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == addr for a in addrs):
            return name
    return None


def address_of(iface: str) -> str | None:
    """The first IPv4 address of interface ``iface`` on this machine (None: no such interface or address)."""
    import psutil

    for a in psutil.net_if_addrs().get(iface, []):
        if a.family == socket.AF_INET:
            return str(a.address)
    return None


def interfaces() -> list[str]:
    """The names of this machine's interfaces that have an IPv4 address."""
    import psutil

    return sorted(name for name, addrs in psutil.net_if_addrs().items()
                  if any(a.family == socket.AF_INET for a in addrs))
