"""Real local deployments for the live-stack tests (``fluidpd up`` subprocesses)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fluidpd.drills.stack import LocalStack

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def stack_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalStack]]:
    """Starts deployments; each is stopped after the module and checked for orphans."""
    started: list[LocalStack] = []
    root = tmp_path_factory.mktemp("stacks")

    def start(pd: str = "2P2D", policy: str = "static", *extra: str) -> LocalStack:
        stack = LocalStack(root / f"up-{len(started)}", pd, policy, *extra, token=TOKEN)
        started.append(stack.__enter__())
        return stack

    yield start
    for stack in started:
        leftovers = stack.stop()
        assert not leftovers, f"outlived fluidpd up: {leftovers}"
