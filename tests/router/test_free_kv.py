"""The router's least-loaded pairing reads a decode worker's free KV through the core's eq. (6)."""

from __future__ import annotations

from fluidpd.core.signals import allocatable_kv
from fluidpd.router.app import _free_kv


def test_free_kv_is_eq6_of_the_last_report() -> None:
    report = {"kv_capacity": 1000, "kv_used": 300, "kv_reserved": 200, "queue_len": 4}
    assert _free_kv(report) == allocatable_kv(1000, 300, 200) == 500
    assert _free_kv({}) == 0.0  # a worker not polled yet offers nothing
