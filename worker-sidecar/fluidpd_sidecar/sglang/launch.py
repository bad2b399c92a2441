"""FluidPD's entry point for an SGLang server: ``python launch.py SGLANG-SERVER-ARGS...``.

Runs SGLang's own HTTP server entry point (``sglang.srt.entrypoints.http_server.launch_server``,
what ``python -m sglang.launch_server`` runs) with our ``hook.run_scheduler_process`` as the
scheduler process target, a parameter SGLang's launcher takes. No SGLang source is copied or
forked. Run by SGLang's interpreter with this directory's parent's parent on ``PYTHONPATH``.

On CPU, SGLang 0.5.17's rotary embedding imports ``vllm._custom_ops.rotary_embedding`` (there
is no CPU build of its kernel package); ``cpu_stubs`` on the path provides a pure-torch one.
Also on CPU, the scheduler and detokenizer processes are forked rather than spawned
(``fork_children_on_cpu``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any


def main(argv: list[str]) -> None:
    # Imported here, not at the top: FluidPD's linters and type checker read this module in an
    # environment without SGLang.
    from sglang.srt.entrypoints.http_server import launch_server  # noqa: PLC0415
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415
    from sglang.srt.utils import kill_process_tree  # noqa: PLC0415

    from fluidpd_sidecar.sglang import roleswitch  # noqa: PLC0415
    from fluidpd_sidecar.sglang.hook import run_scheduler_process  # noqa: PLC0415

    if roleswitch.enabled():
        roleswitch.serve_bootstrap_everywhere()
    server_args = prepare_server_args(argv)
    if server_args.device == "cpu":
        fork_children_on_cpu()
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def fork_children_on_cpu() -> None:
    """Fork SGLang's scheduler and detokenizer from this process instead of spawning them.

    SGLang sets the ``spawn`` start method because a forked child cannot use CUDA once the
    parent has touched it. A CPU server never initializes CUDA, and a spawned child imports
    torch and SGLang again: 6-8 s of CPU for each of the two. Measured on a 2-core machine, a
    whole CPU server start took 17 s and 21 CPU-s spawned, 10-11 s and 7-9 CPU-s forked, with
    the same greedy output ids. The start method is switched right after SGLang's own
    environment setup, where SGLang chose spawn; the children are forked before this process
    runs a Python thread or its HTTP server."""
    from sglang.srt.entrypoints import engine  # noqa: PLC0415

    sglang_setup = engine._set_envs_and_config

    def set_envs_and_config(server_args: Any) -> None:
        sglang_setup(server_args)
        multiprocessing.set_start_method("fork", force=True)

    engine._set_envs_and_config = set_envs_and_config


if __name__ == "__main__":
    main(sys.argv[1:])
