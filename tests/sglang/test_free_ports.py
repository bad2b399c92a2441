"""The ports a sidecar hands SGLang and its hook: free, distinct, and out of the kernel's
ephemeral range, so that no outgoing connection takes one before SGLang binds it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from fluidpd_sidecar.sglang import server
from fluidpd_sidecar.sglang.server import (
    LISTEN_PORT_FLOOR,
    SglangConfig,
    SglangError,
    SglangServer,
    free_ports,
    server_command,
)


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


def test_ports_to_avoid_are_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # A range of three ports, two of them promised elsewhere: every draw gives the third.
    start = server._ephemeral_start()
    if start <= LISTEN_PORT_FLOOR + 3:
        pytest.skip("no ephemeral range above the floor on this kernel")
    for _ in range(20):
        base = free_ports(1)[0]
        if base + 2 < start and all(_bindable(base + i) for i in range(3)):
            break
    monkeypatch.setattr(server, "LISTEN_PORT_FLOOR", base)
    monkeypatch.setattr(server, "_ephemeral_start", lambda: base + 3)
    for _ in range(10):
        assert free_ports(1, avoid={base, base + 2, None}) == [base + 1]


def test_without_a_range_the_kernel_is_asked_again_for_an_avoided_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "_ephemeral_start", lambda: 0)
    first = free_ports(1)[0]
    assert first not in free_ports(5, avoid={first})


def test_every_start_passes_a_fresh_nccl_port(tmp_path: Path) -> None:
    """torch.distributed's port is drawn by ``free_ports`` at each (re)start, not left to
    SGLang's ephemeral pick (the race behind a restart's EADDRINUSE), and never one of the
    server's own ports."""
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\necho "$@"\nexit 3\n')
    fake_python.chmod(0o755)
    log = tmp_path / "sglang.log"
    cfg = SglangConfig(python=str(fake_python), model_dir=tmp_path, port=free_ports(1)[0],
                       hook_port=free_ports(1)[0], device="cpu", log_path=log)  # fmt: skip
    srv = SglangServer(cfg)
    for _ in range(2):
        with pytest.raises(SglangError, match="while starting"):
            asyncio.run(srv.start())
    ports = [int(line.split("--nccl-port ")[1].split()[0]) for line in log.read_text().splitlines()]
    assert len(ports) == 2 and ports[0] != ports[1]
    assert not {cfg.port, cfg.hook_port} & set(ports)
    assert all(_bindable(p) for p in ports)


def test_a_user_given_nccl_port_is_kept() -> None:
    cfg = SglangConfig(python="py", model_dir=Path("/m"), port=1, hook_port=2,
                       extra_args=("--nccl-port", "4242"))  # fmt: skip
    argv = server_command(cfg, nccl_port=5000)
    assert argv.count("--nccl-port") == 1 and argv[argv.index("--nccl-port") + 1] == "4242"
    plain = SglangConfig(python="py", model_dir=Path("/m"), port=1, hook_port=2)
    assert "--nccl-port" not in server_command(plain)
