"""``fluidpd operator``: runs the kopf operator (thin; the handlers hold the logic)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import kopf


def run(
    namespaces: Sequence[str],
    standalone: bool,
    priority: int,
    liveness: str | None,
) -> int:
    # Importing the handlers registers them with kopf (and reads the FLUIDPD_* settings).
    from fluidpd_operator import handlers  # noqa: PLC0415

    logging.basicConfig(
        level=handlers.CONFIG.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=standalone or None,
            priority=priority,
            liveness_endpoint=liveness,
        )
    )
    return 0
