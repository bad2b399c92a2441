"""``backend: sglang`` on the real test control plane: a FluidPDDeployment whose workers run
real SGLang 0.5.17 servers (on CPU, the recipe of tests/sglang) reconciles to Ready and serves.

The workers' image is the operator's default for sglang, ``images/sglang-worker``; the fake
kubelet runs it as its Dockerfile defines it (its ENV under the pod's env, ``harness.images``),
with one path changed for this host: the image's SGLang interpreter
(``FLUIDPD_SGLANG_PYTHON=/usr/bin/python3`` there) is SGLang's own venv here
(``scripts/sglang/mkvenv.sh``). The model is the synthetic tiny Llama, built at test time, on a
hostPath. No Degraded condition and no UnsupportedBackend Event: that path is gone.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluidpd.modeldir.synthetic import write_model
from harness import ControlPlane, FakeKubelet, sglang_venv, wait_for
from harness.images import image_definition
from harness.operator import (
    Operator,
    apply,
    events,
    router_url,
    status,
    wait_ready,
    worker_pods,
)

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "ghcr.io/fluidpd/sglang-worker"  # FLUIDPD_SGLANG_IMAGE's default repository
MODEL = "llama-3.1-8b"  # a shipped profile's name; the weights are the tiny model's
#: Two SGLang servers start at once in the pods: 60-120 s each on two idle cores, several
#: minutes on a loaded machine.
READY_S = 900


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    write_model(out, arch="llama")
    out.chmod(0o755)
    return out


@pytest.fixture(scope="module")
def sglang_python() -> str:
    return sglang_venv.sglang_python()


@pytest.fixture
def sglang_image(kubelet: FakeKubelet, sglang_python: str) -> Iterator[dict[str, str]]:
    image = image_definition(ROOT / "images/sglang-worker/Dockerfile")
    assert image.env.get("FLUIDPD_SGLANG_PYTHON"), "the image must say where its SGLang is"
    env = {**image.env, "FLUIDPD_SGLANG_PYTHON": sglang_python}
    kubelet.image_env[IMAGE] = env
    if image.entrypoint:
        kubelet.image_entrypoints[IMAGE] = image.entrypoint
    yield env
    kubelet.image_env.pop(IMAGE, None)
    kubelet.image_entrypoints.pop(IMAGE, None)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _get(url: str, token: str | None = None) -> Any:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_sglang_deployment_reconciles_to_ready_and_serves(
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
    operator: Operator,
    namespace: str,
    model_dir: Path,
    sglang_python: str,
    sglang_image: dict[str, str],
) -> None:
    openai = pytest.importorskip("openai")
    cp, ns, name = control_plane, namespace, "sgl-ready"
    apply(cp, ns, {
        "apiVersion": "fluidpd.io/v1alpha1", "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL, "source": {"hostPath": {"path": str(model_dir)}}},
            # SGLang's CPU recipe: a small KV pool, a start limit for a loaded machine.
            "engine": {"backend": "sglang", "args": [
                "--device", "cpu", "--sglang-max-total-tokens", "4096",
                "--sglang-start-timeout", str(READY_S)]},
            "workers": 2, "prefill": 1,
        },
    })  # fmt: skip
    wait_ready(cp, ns, name, 2, timeout=READY_S)

    roles = set()
    for pod in worker_pods(cp, ns, name):
        c = pod["spec"]["containers"][0]
        assert c["image"].startswith(f"{IMAGE}:"), c["image"]
        assert c["args"][c["args"].index("--engine") + 1] == "sglang"
        roles.add(pod["metadata"]["labels"]["fluidpd.io/role"])
        # The sidecar found SGLang where the image says (no --sglang-python flag) and runs it.
        pid = wait_for(lambda p=pod: kubelet.pid(p["metadata"]["name"], ns), timeout=30,
                       what="the sidecar's process")  # fmt: skip
        env = _environ(pid)
        assert env["FLUIDPD_SGLANG_PYTHON"] == sglang_python
        assert "--sglang-python" not in c["args"]
        info = _get(f"http://{pod['status']['podIP']}:8100/v1/internal/sglang",
                    env["FLUIDPD_ADMIN_TOKEN"])  # fmt: skip
        argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().decode().split("\0")
        assert argv[0] == sglang_python and "fluidpd_sidecar.sglang.launch" in argv, argv
        assert info["mode"] == pod["metadata"]["labels"]["fluidpd.io/role"]
    assert roles == {"prefill", "decode"}

    st = status(cp, ns, name)
    degraded = [c for c in st.get("conditions", []) if c["type"] == "Degraded"]
    assert all(c["status"] != "True" for c in degraded), degraded
    assert not events(cp, ns, "UnsupportedBackend")

    # Served through the router: the prompt's KV goes prefill -> decode over SGLang's transfer.
    api = openai.OpenAI(base_url=f"{router_url(cp, ns, name)}/v1", api_key="unused",
                        max_retries=0, timeout=300)  # fmt: skip
    prompt = [[(7 * i) % 900 + 20 for i in range(40)]]
    got = api.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True})  # fmt: skip
    assert got.usage is not None and got.usage.completion_tokens == 12, got
