"""The address this machine gives the other nodes of a multi-node run, and the check that
they can reach it.

gloo (the CPU backend, and the control group of every multi-process run) binds the address of
``GLOO_SOCKET_IFNAME``'s interface when that is set, else the first address this machine's
host name resolves to, and publishes it to the other nodes through the rendezvous store. A
host name that resolves to a loopback address (common on fresh machines and in containers:
``127.0.1.1 myhost`` in /etc/hosts) sends every other node to itself: both sides then wait
for the store's full timeout. :func:`loopback_problem` finds that before anything starts;
``dist.interface`` fixes it (:func:`backend_env` passes it to gloo and NCCL, and its address
to the rendezvous). The resolver and the interface list are arguments, so a test can give
them. Torch-free.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Callable, Mapping

Interfaces = Callable[[], Mapping[str, list]]  # psutil.net_if_addrs' shape


def _interfaces() -> Mapping[str, list]:
    import psutil

    return psutil.net_if_addrs()


def _resolve(hostname: str) -> list[str]:
    infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def interface_address(name: str, interfaces: Interfaces = _interfaces) -> str | None:
    """The interface's first IPv4 address (else its first IPv6 one); None when there is no
    such interface or it has no address."""
    addrs = interfaces().get(name) or []
    for family in (socket.AF_INET, socket.AF_INET6):
        for a in addrs:
            if a.family == family:
                return str(a.address)
    return None


def own_addresses(interfaces: Interfaces = _interfaces) -> set[str]:
    """Every address of this machine's interfaces."""
    return {str(a.address).split("%")[0] for addrs in interfaces().values() for a in addrs}


def reachable_interfaces(interfaces: Interfaces = _interfaces) -> list[str]:
    """"eth0 10.0.0.5" for each interface with a non-loopback IPv4 address."""
    out = []
    for name, addrs in interfaces().items():
        for a in addrs:
            if a.family == socket.AF_INET and not is_loopback(str(a.address)):
                out.append(f"{name} {a.address}")
                break
    return out


def loopback_problem(interface: str, env: Mapping[str, str],
                     hostname: Callable[[], str] | None = None,
                     resolve: Callable[[str], list[str]] = _resolve,
                     interfaces: Interfaces = _interfaces) -> str | None:
    """Why the other nodes could not reach this one at the address it would give them (one
    line naming the address, why, and the setting that fixes it), or None. ``hostname``:
    ``socket.gethostname`` unless given."""
    chosen = interface or env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    setting = "dist.interface" if interface else "GLOO_SOCKET_IFNAME"
    if chosen:
        address = interface_address(chosen, interfaces)
        if address is None:
            return interface_problem(chosen, setting, interfaces)
        source = f"{setting} = {chosen!r} has the address {address}"
    else:
        name = (hostname or socket.gethostname)()
        try:
            found = resolve(name)
        except (OSError, UnicodeError) as exc:
            return (f"this machine's host name {name!r} does not resolve ({exc}), so no address "
                    f"can be given to the other nodes; set dist.interface to the network "
                    f"interface that reaches them{_have(interfaces)}")
        if not found:
            return None
        address = found[0]
        source = f"this machine's host name {name!r} resolves to {address}"
    if not is_loopback(address):
        return None
    return (f"{source}, a loopback address: the other nodes would connect to themselves "
            f"there, not to this machine, and wait until the rendezvous times out; set "
            f"dist.interface to the network interface that reaches them (--set "
            f"dist.interface=NAME){_have(interfaces)}")


def interface_problem(name: str, setting: str = "dist.interface",
                      interfaces: Interfaces = _interfaces) -> str | None:
    """Why ``name`` cannot be the interface gloo binds (one line), or None."""
    if interface_address(name, interfaces) is not None:
        return None
    return (f"{setting} = {name!r}: this machine has no network interface of that name with "
            f"an address{_have(interfaces)}")


def _have(interfaces: Interfaces) -> str:
    try:
        found = reachable_interfaces(interfaces)
    except Exception:  # noqa: BLE001 - the list only helps the message
        found = []
    return f" (here: {', '.join(found)})" if found else ""


def backend_env(interface: str) -> dict[str, str]:
    """What gloo and NCCL need to use ``interface`` (empty: they choose themselves)."""
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface} \
        if interface else {}
