"""A FluidPDDeployment's model directory (``spec.model.source``) on the real test control plane.

- On a PersistentVolumeClaim, statically provisioned (the test plane has no provisioner): the
  pods wait, Pending, while the claim is unbound, and the FluidPDDeployment says why; once the
  PV controller binds it, every worker and the router run with the PV's files read-only at
  /mnt/models and ``--model-dir /mnt/models``.
- On a hostPath with ``backend: gpu`` (the tiny synthetic Llama on CPU): the deployment
  reconciles to Ready and a chat completion through the router, with the official ``openai``
  client, equals ``transformers``' greedy ``generate`` on the same model and chat-template-
  rendered prompt, decoded by the same tokenizer.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from fluidpd.modeldir.synthetic import write_model
from harness import ControlPlane, FakeKubelet, wait_for
from harness.operator import (
    Operator,
    apply,
    condition,
    kubectl_json,
    router_url,
    status,
    wait_ready,
    worker_pods,
)

pytestmark = pytest.mark.k8s

MODEL_DIR = "/mnt/models"  # where the operator mounts spec.model.source
SERVED = "tiny-llama"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic tiny Llama (seed 0, byte-level BPE, chat template): ``tiny_llama_dir``'s
    model, written here because the e2e tests have their own conftest."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    write_model(out, arch="llama")
    out.chmod(0o755)
    return out


def _pid(kubelet: FakeKubelet, pod: str, ns: str) -> int:
    pid: int = wait_for(lambda: kubelet.pid(pod, ns), timeout=60, what=f"{pod}'s process")
    return pid


def _mount_options(pid: int, target: str) -> list[str]:
    """The options of the mount at ``target`` as the process sees it (its mount namespace)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == target:
            return fields[5].split(",")
    raise AssertionError(f"nothing is mounted at {target} for process {pid}")


def _assert_sees_the_model(pid: int, model: Path) -> None:
    """The process has ``--model-dir /mnt/models`` and sees the model's files there, read-only."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--model-dir") + 1] == MODEL_DIR, argv
    assert "ro" in _mount_options(pid, MODEL_DIR)
    # /proc/PID/root resolves paths in the process's mount namespace.
    seen = Path(f"/proc/{pid}/root{MODEL_DIR}")
    assert sorted(p.name for p in seen.iterdir()) == sorted(p.name for p in model.iterdir())
    assert (seen / "config.json").read_bytes() == (model / "config.json").read_bytes()


def _router_pod(cp: ControlPlane, ns: str, name: str) -> str:
    pods = kubectl_json(
        cp, "get", "pods", "-n", ns, "-l",
        f"fluidpd.io/deployment={name},app.kubernetes.io/component=router",
    )["items"]  # fmt: skip
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in pods]
    return str(live[0]["metadata"]["name"])


def test_model_directory_on_a_claim_is_mounted_read_only_once_bound(
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
    operator: Operator,
    namespace: str,
    model_dir: Path,
    persistent_volumes: list[str],
) -> None:
    cp, ns, name = control_plane, namespace, "on-claim"
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_persistent_volume_claim(ns, {
        "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    apply(cp, ns, {
        "apiVersion": "fluidpd.io/v1alpha1", "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": "llama-3.1-8b", "source": {"persistentVolumeClaim": {
            "claimName": "models", "subPath": model_dir.name}}},
            "workers": 2, "prefill": 1},
    })  # fmt: skip

    # Unbound: kube-scheduler places no worker, and the deployment says why.
    def degraded_by_the_claim() -> str | None:
        for c in status(cp, ns, name).get("conditions", []):
            if c["type"] == "Degraded" and "unbound" in c["message"]:
                return str(c["message"])
        return None

    message = wait_for(degraded_by_the_claim, timeout=90, what="Degraded naming the claim")
    assert "Unschedulable" in message and "PersistentVolumeClaims" in message, message
    assert condition(status(cp, ns, name), "Ready") == "False"
    assert all(not p["spec"].get("nodeName") for p in worker_pods(cp, ns, name))

    # Static provisioning: the PV (the model's parent directory on this node) for that claim.
    pv = f"models-{uuid.uuid4().hex[:6]}"
    core.create_persistent_volume({
        "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "claimRef": {"namespace": ns, "name": "models"},
                 "hostPath": {"path": str(model_dir.parent), "type": "Directory"}},
    })  # fmt: skip
    persistent_volumes.append(pv)
    wait_ready(cp, ns, name, 2)
    for pod in worker_pods(cp, ns, name):
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
        assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
        _assert_sees_the_model(_pid(kubelet, pod["metadata"]["name"], ns), model_dir)
    _assert_sees_the_model(_pid(kubelet, _router_pod(cp, ns, name), ns), model_dir)
    assert not (model_dir / "written").exists()


@pytest.fixture(scope="module")
def tiny_profile(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A profile of the tiny model on this CPU, measured by ``fluidpd profile`` on the gpu engine,
    served under the name ``SERVED``."""
    out = tmp_path_factory.mktemp("profile") / "tiny-llama-cpu.yaml"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("fluidpd")), "profile", "--model-dir", str(model_dir),
         "--device", "cpu", "--dtype", "float32", "--gpu", "cpu", "--kv-tokens", "12000",
         "--context-limit", "4096", "--max-running", "16", "--quick", "--max-mre", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = yaml.safe_load(out.read_text())
    doc["model"] = SERVED
    doc["name"] = f"{SERVED}-cpu"
    return yaml.safe_dump(doc)


def _reference(model_dir: Path, messages: list[dict[str, str]], max_new: int) -> tuple[str, int]:
    """transformers' greedy text for the chat-template-rendered prompt, and the prompt's length."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # a BatchEncoding in some versions
        ids = list(ids["input_ids"])
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new, do_sample=False
        )
    text = tok.decode(out[0][len(ids) :].tolist(), skip_special_tokens=True)
    return str(text), len(ids)


MESSAGES = [
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Translate 你好 and 😀 into English, please."},
    ],
]


def test_gpu_backend_on_a_host_path_serves_the_reference_chat_completion(
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
    operator: Operator,
    namespace: str,
    model_dir: Path,
    tiny_profile: str,
) -> None:
    openai = pytest.importorskip("openai")
    cp, ns, name = control_plane, namespace, "chat"
    cp.kubectl("create", "configmap", "tiny-profile", "-n", ns,
               f"--from-literal=profile.yaml={tiny_profile}")  # fmt: skip
    apply(cp, ns, {
        "apiVersion": "fluidpd.io/v1alpha1", "kind": "FluidPDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": SERVED, "profileConfigMap": "tiny-profile",
                      "source": {"hostPath": {"path": str(model_dir)}}},
            # One host here: the workers share /dev/shm. The tiny shape on CPU, in float32.
            "engine": {"backend": "gpu", "kvTransfer": "shm",
                       "args": ["--device", "cpu", "--dtype", "float32", "--kv-arena-mib", "16"]},
            "workers": 2, "prefill": 1,
            "fluidRole": {"enabled": False},
        },
    })  # fmt: skip
    wait_ready(cp, ns, name, 2, timeout=240)
    for pod in worker_pods(cp, ns, name):
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
        assert volume["hostPath"] == {"path": str(model_dir), "type": "Directory"}
        _assert_sees_the_model(_pid(kubelet, pod["metadata"]["name"], ns), model_dir)
    url = router_url(cp, ns, name)
    _assert_sees_the_model(_pid(kubelet, _router_pod(cp, ns, name), ns), model_dir)

    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    max_new = 24
    for messages in MESSAGES:
        want, prompt_len = _reference(model_dir, messages, max_new)
        assert want, "the reference is empty: the comparison would prove nothing"
        got = api.chat.completions.create(
            model=SERVED,
            messages=messages,
            max_tokens=max_new,
            temperature=0,
        )
        choice = got.choices[0]
        assert got.model == SERVED
        assert choice.message.content == want, (messages, choice.message.content, want)
        assert choice.finish_reason in ("stop", "length")
        assert got.usage is not None and got.usage.prompt_tokens == prompt_len
        if choice.finish_reason == "length":
            assert got.usage.completion_tokens == max_new
        # Streamed, the deltas add up to the same text.
        stream = api.chat.completions.create(
            model=SERVED, messages=messages, max_tokens=max_new, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == want, (messages, text, want)
