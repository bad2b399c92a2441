"""`python -m harness.cluster` (`make cluster`): the test control plane plus the fake kubelet,
until Ctrl-C. Prints `export KUBECONFIG=...` once the node is Ready."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from harness.binaries import CONTROL_PLANE, ensure_binaries
from harness.controlplane import DEFAULT_NODE, ControlPlane
from harness.kubelet import FakeKubelet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster", description=__doc__)
    parser.add_argument(
        "--dir",
        type=Path,
        help="keep certificates, etcd data, kubeconfigs and logs here (default: a temp dir, "
        "removed on exit)",
    )
    parser.add_argument("--no-kubelet", action="store_true", help="run no fake kubelet")
    parser.add_argument("--node-name", default=DEFAULT_NODE)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    bin_dir = ensure_binaries(CONTROL_PLANE)
    with ControlPlane(bin_dir, workdir=args.dir, node_names=(args.node_name,)) as cp:
        kubelet = None if args.no_kubelet else FakeKubelet(cp, node_name=args.node_name).start()
        try:
            print(f"# control plane at {cp.server} (up in {time.monotonic() - t0:.1f} s)")
            print(f"# component logs: {cp.workdir / 'logs'}")
            if kubelet is not None:
                print(f"# pod output: {kubelet.log_dir}")
            print(f"export KUBECONFIG={cp.kubeconfig}")
            print(f'export PATH="{bin_dir}:$PATH"  # kubectl, helm')
            print("# Ctrl-C stops everything", flush=True)
            while not stop.wait(1.0):
                cp.check_alive()
        finally:
            if kubelet is not None:
                kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
