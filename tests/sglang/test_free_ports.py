"""The ports a sidecar hands SGLang and its hook: free, distinct, and out of the kernel's
ephemeral range, so that no outgoing connection takes one before SGLang binds it."""

from __future__ import annotations

import socket

import pytest

from fluidpd_sidecar.sglang import server
from fluidpd_sidecar.sglang.server import LISTEN_PORT_FLOOR, free_ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    start = server._ephemeral_start()
    if start <= LISTEN_PORT_FLOOR:
        pytest.skip("no ephemeral range above the floor on this kernel")
    for _ in range(20):
        ports = free_ports(6)
        assert len(set(ports)) == 6
        assert all(LISTEN_PORT_FLOOR <= p < start for p in ports), ports
        assert all(_bindable(p) for p in ports)


def test_a_taken_port_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # A range of two ports, one of them taken: every draw must give the other.
        monkeypatch.setattr(server, "LISTEN_PORT_FLOOR", taken)
        monkeypatch.setattr(server, "_ephemeral_start", lambda: taken + 2)
        for _ in range(10):
            (port,) = free_ports(1)
            assert port != taken and _bindable(port)


def test_without_an_ephemeral_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_ephemeral_start", lambda: 0)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(_bindable(p) for p in ports)
