"""``fluidpd replay``: replay a workload against an OpenAI-compatible endpoint.

``prompts`` synthesizes deterministic prompts and request bodies, ``client`` runs the open-loop
streaming replay and ``results`` turns it into the simulator's results.json record, time series
and (appending) results directory.
"""

from fluidpd.replay.client import (
    EndpointUnreachable,
    Outcome,
    Progress,
    ReplayConfig,
    ReplayResult,
    fetch_admin_stats,
    list_models,
    replay,
)
from fluidpd.replay.results import ReplayMeta, ResultsFileError, build_output

__all__ = [
    "EndpointUnreachable",
    "Outcome",
    "Progress",
    "ReplayConfig",
    "ReplayMeta",
    "ReplayResult",
    "ResultsFileError",
    "build_output",
    "fetch_admin_stats",
    "list_models",
    "replay",
]
