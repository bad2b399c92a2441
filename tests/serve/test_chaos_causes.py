"""The chaos drill's failure causes (``fluidpd.drills.chaos.classify``), without a stack."""

from __future__ import annotations

from fluidpd.drills.chaos import DECODE_LOST, ROUTER_CUT, UNEXPLAINED, Kill, classify
from fluidpd.drills.load import Outcome

CUT = (
    "ClientPayloadError: Response payload is not completed: <TransferEncodingError: 400, "
    "message='Not enough data to satisfy transfer length header.'>"
)


def _stream(start: float, first: float, end: float, error: str = CUT) -> Outcome:
    return Outcome(start, end=end, status=200, error=error, stream=True, first_token=first)


def test_a_stream_cut_by_a_router_kill_is_explained_even_if_its_first_token_was_read_after() -> (
    None
):
    """The drill kills on the client's event loop: tokens the router sent before the kill at
    5.0 are read, and the first token stamped, at 5.2, and the cut follows."""
    router = [Kill(5.0, "router", "router")]
    assert classify(_stream(1.0, 5.2, 5.3), router) == ROUTER_CUT
    assert classify(_stream(1.0, 2.0, 5.3), router) == ROUTER_CUT


def test_a_cut_no_router_kill_falls_within_is_unexplained() -> None:
    assert classify(_stream(1.0, 2.0, 4.0), [Kill(5.0, "router", "router")]) == UNEXPLAINED
    assert classify(_stream(6.0, 6.5, 7.0), [Kill(5.0, "router", "router")]) == UNEXPLAINED
    # A sidecar's kill does not cut the router's stream to the client.
    assert classify(_stream(1.0, 2.0, 5.3), [Kill(5.0, "w2", "decode sidecar")]) == UNEXPLAINED


def test_a_cut_before_any_token_is_not_the_router_kills() -> None:
    """Such a request is retried by the client; if it still fails, nothing explains it."""
    assert classify(_stream(1.0, 0.0, 5.3), [Kill(5.0, "router", "router")]) == UNEXPLAINED


def test_a_decode_worker_lost_mid_stream_needs_that_workers_kill_during_the_request() -> None:
    o = _stream(1.0, 2.0, 5.3, "decode worker w3 was lost mid-stream")
    assert classify(o, [Kill(5.0, "w3", "decode sidecar")]) == DECODE_LOST
    assert classify(o, [Kill(5.0, "w2", "decode sidecar")]) == UNEXPLAINED
