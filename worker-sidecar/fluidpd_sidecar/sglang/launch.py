"""FluidPD's entry point for an SGLang server: ``python launch.py SGLANG-SERVER-ARGS...``.

Runs SGLang's own HTTP server entry point (``sglang.srt.entrypoints.http_server.launch_server``,
what ``python -m sglang.launch_server`` runs) with our ``hook.run_scheduler_process`` as the
scheduler process target, a parameter SGLang's launcher takes. No SGLang source is copied or
forked. Run by SGLang's interpreter with this directory's parent's parent on ``PYTHONPATH``.

On CPU, SGLang 0.5.17's rotary embedding imports ``vllm._custom_ops.rotary_embedding`` (there
is no CPU build of its kernel package); ``cpu_stubs`` on the path provides a pure-torch one.
"""

from __future__ import annotations

import os
import sys


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
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
