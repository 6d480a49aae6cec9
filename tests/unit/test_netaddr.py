"""The address a node gives the others (hw/netaddr.py): a host name that resolves to a
loopback address is refused before the rendezvous would wait its whole timeout, with the
address, why, and the setting that fixes it. The resolver and the interface list are the
boundary the tests give; the check itself is real."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from gputui.core.config import ConfigError, load_preset
from gputui.core.presets import resolve_preset
from gputui.hw.netaddr import backend_env, loopback_problem


def _addr(family, address):
    return SimpleNamespace(family=family, address=address)


IFACES = {"lo": [_addr(socket.AF_INET, "127.0.0.1")],
          "eth0": [_addr(socket.AF_INET6, "fe80::1"), _addr(socket.AF_INET, "10.0.0.5")]}


def _check(interface="", env=None, resolves=("127.0.1.1",), raises=None):
    def resolve(name):
        if raises:
            raise raises
        return list(resolves)

    return loopback_problem(interface, env or {}, hostname=lambda: "node7", resolve=resolve,
                            interfaces=lambda: IFACES)


def test_a_host_name_on_loopback_is_named_with_its_fix():
    assert _check() == (
        "this machine's host name 'node7' resolves to 127.0.1.1, a loopback address: the "
        "other nodes would connect to themselves there, not to this machine, and wait until "
        "the rendezvous times out; set dist.interface to the network interface that reaches "
        "them (--set dist.interface=NAME) (here: eth0 10.0.0.5)")
    assert _check(resolves=("::1",)) is not None


def test_an_address_others_can_reach_passes():
    assert _check(resolves=("10.0.0.5", "127.0.1.1")) is None
    assert _check(interface="eth0") is None  # the interface's address, whatever the name says
    assert _check(env={"GLOO_SOCKET_IFNAME": "eth0"}) is None


def test_an_interface_that_is_loopback_or_absent_is_refused():
    assert _check(interface="lo").startswith(
        "dist.interface = 'lo' has the address 127.0.0.1, a loopback address")
    assert _check(env={"GLOO_SOCKET_IFNAME": "lo"}).startswith(
        "GLOO_SOCKET_IFNAME = 'lo' has the address 127.0.0.1")
    assert _check(interface="wlan9") == (
        "dist.interface = 'wlan9': this machine has no network interface of that name with an "
        "address (here: eth0 10.0.0.5)")
    assert _check(raises=socket.gaierror(-2, "Name or service not known")).startswith(
        "this machine's host name 'node7' does not resolve ([Errno -2] Name or service not "
        "known)")


def test_the_interface_reaches_the_backends_and_is_checked_as_a_name():
    assert backend_env("eth0") == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert backend_env("") == {}
    with pytest.raises(ConfigError, match="dist.interface must be a network interface name"):
        load_preset(resolve_preset("quickstart"), [("--set", "dist.interface", "eth0; rm")])


def test_a_multi_node_run_is_refused_before_launch_on_this_machine(monkeypatch):
    """The entry every run takes (runs/prepare) asks the check for several nodes only."""
    from gputui.hw import netaddr
    from gputui.runs.prepare import check_network

    monkeypatch.setattr(netaddr.socket, "gethostname", lambda: "localhost")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    cfg = load_preset(resolve_preset("lenet-ddp-2nodes"),
                      [("--set", "dist.rdzv_endpoint", "10.0.0.5:29400")])
    with pytest.raises(ConfigError, match=r"^dist.nnodes = 2: this machine's host name "
                                          r"'localhost' resolves to (127\.0\.0\.1|::1), a "
                                          r"loopback address"):
        check_network(cfg)
    check_network(load_preset(resolve_preset("quickstart"), []))  # one node: nothing asked
    # every node on this machine (the rendezvous on loopback): loopback reaches them all
    check_network(load_preset(resolve_preset("lenet-ddp-2nodes"),
                              [("--set", "dist.rdzv_endpoint", "127.0.0.1:29400")]))
    with pytest.raises(ConfigError, match=r"^dist.interface = 'no-such-if0': this machine has no "
                                          r"network interface of that name"):
        check_network(load_preset(resolve_preset("quickstart"),
                                  [("--set", "dist.interface", "no-such-if0")]))
