"""Pod volumes as the fake kubelet sets them up and mounts them, the way the real kubelet does.

Two steps, in the kubelet's order:

1. ``set_up`` (before the pod's sandbox exists): each volume becomes a path on this host.
   ConfigMap and Secret keys (or their ``items``) are written under the pod's directory;
   ``hostPath`` is checked against its ``type``
   (``DirectoryOrCreate``/``FileOrCreate`` create it, mode 0755/0644) and used in place; a
   ``persistentVolumeClaim`` is followed to its bound PersistentVolume, whose ``hostPath`` or
   ``local`` source is used in place. A failure raises ``VolumeError``: the pod waits in
   ContainerCreating and the kubelet posts a ``FailedMount`` Event with the real kubelet's wording.
2. ``container_mounts`` (when the container is created): each ``volumeMount`` becomes a bind
   mount, with ``subPath``/``subPathExpr`` (a missing sub-path is created, as the kubelet does)
   and read-only where the mount, the claim (``persistentVolumeClaim.readOnly``) or the kind
   (ConfigMap, Secret) says so. ``in_mount_namespace`` runs the container's argv in its own
   mount namespace with those binds (``unshare --mount``; root only), so two pods can mount
   different data at the same path and the host's paths are never covered.

Volume kinds other than these (emptyDir, projected, downwardAPI, csi, ...) are not set up; a
container mounting one sees the host's path as it is. (An emptyDir is typically a scratch /tmp:
covering this host's /tmp would hide the pod's own kubeconfig and every test's files.)
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.expansion import expand

Obj = dict[str, Any]

HOST_PATH_TYPES = (
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
)


class VolumeError(Exception):
    """A volume could not be set up; ``str()`` is the FailedMount Event's message."""


class SubPathError(Exception):
    """A mount's sub-path could not be made (the kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True)
class VolumePath:
    """A set-up volume: where its data is on this host, and whether it is read-only as a whole."""

    path: Path
    read_only: bool


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def check_host_path(path: str, kind: str) -> None:
    """The kubelet's hostPath type check (pkg/volume/hostpath ``checkTypeInternal``)."""
    p = Path(path)
    if kind not in HOST_PATH_TYPES:
        raise VolumeError(f"{kind} is an invalid volume type")
    if kind == "DirectoryOrCreate" and not p.exists():
        p.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(p, 0o755)  # as the kubelet makes it, whatever this process's umask
        return
    if kind == "FileOrCreate" and not p.exists():
        with open(p, "a"):  # no parents, as the kubelet's makeFile: a missing parent fails
            pass
        os.chmod(p, 0o644)
        return
    expect = {
        "DirectoryOrCreate": (stat.S_ISDIR, "directory"),
        "Directory": (stat.S_ISDIR, "directory"),
        "FileOrCreate": (stat.S_ISREG, "file"),
        "File": (stat.S_ISREG, "file"),
        "Socket": (stat.S_ISSOCK, "socket file"),
        "CharDevice": (stat.S_ISCHR, "character device"),
        "BlockDevice": (stat.S_ISBLK, "block device"),
    }.get(kind)
    if expect is None:
        return  # "": no check at all
    test, what = expect
    try:
        mode = p.stat().st_mode
    except OSError:
        mode = 0
    if not test(mode):
        raise VolumeError(f"hostPath type check failed: {path} is not a {what}")


def _claimed_volume(core: client.CoreV1Api, namespace: str, volume: Obj) -> VolumePath:
    """persistentVolumeClaim -> its bound PV -> a path here (the desired-state populator's
    checks and messages, then the PV's hostPath or local source)."""
    source = volume["persistentVolumeClaim"]
    claim_name = source["claimName"]
    name = volume["name"]
    prefix = (
        f"Unable to attach or mount volumes: unmounted volumes=[{name}], unattached volumes=[], "
        f"failed to process volumes=[{name}]: error processing PVC {namespace}/{claim_name}: "
    )
    try:
        claim = core.read_namespaced_persistent_volume_claim(claim_name, namespace)
    except ApiException as e:
        raise VolumeError(
            f"{prefix}failed to fetch PVC {namespace}/{claim_name} from API server. "
            f"err={_api_message(e)}"
        ) from e
    if claim.metadata.deletion_timestamp is not None:
        raise VolumeError(
            f"{prefix}can't start pod because PVC {namespace}/{claim_name} is being deleted"
        )
    phase = claim.status.phase if claim.status else None
    pv_name = claim.spec.volume_name or ""
    if phase != "Bound" or not pv_name:
        raise VolumeError(
            f'{prefix}PVC {namespace}/{claim_name} has non-bound phase ("{phase or ""}") '
            f'or empty pvc.Spec.VolumeName ("{pv_name}")'
        )
    try:
        pv = core.read_persistent_volume(pv_name)
    except ApiException as e:
        raise VolumeError(
            f'{prefix}failed to fetch PV "{pv_name}" from API server. err={_api_message(e)}'
        ) from e
    ref = pv.spec.claim_ref
    if ref is None:
        raise VolumeError(
            f'{prefix}found PV object "{pv_name}" but it has a nil pv.Spec.ClaimRef indicating '
            "it is not yet bound to the claim"
        )
    if ref.uid != claim.metadata.uid:
        raise VolumeError(
            f'{prefix}found PV object "{pv_name}" but its pv.Spec.ClaimRef.UID ("{ref.uid}") '
            f'does not point to claim.UID ("{claim.metadata.uid}")'
        )
    read_only = bool(source.get("readOnly"))
    setup = f'MountVolume.SetUp failed for volume "{pv_name}" : '
    if pv.spec.host_path is not None:
        try:
            check_host_path(pv.spec.host_path.path, pv.spec.host_path.type or "")
        except VolumeError as e:
            raise VolumeError(setup + str(e)) from e
        return VolumePath(Path(pv.spec.host_path.path), read_only)
    if pv.spec.local is not None:
        path = pv.spec.local.path
        if not Path(path).exists():
            raise VolumeError(
                f'MountVolume.NewMounter initialization failed for volume "{pv_name}" : '
                f'path "{path}" does not exist'
            )
        return VolumePath(Path(path), read_only)
    not_sources = ("capacity", "claim_ref", "node_affinity")
    kinds = sorted(
        k for k, v in pv.spec.to_dict().items() if isinstance(v, dict) and k not in not_sources
    )
    raise VolumeError(
        f"{setup}the fake kubelet mounts only hostPath and local PersistentVolumes, not {kinds}"
    )


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(e.reason)


def _write_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    shutil.rmtree(root, ignore_errors=True)  # a restart sees the data as it is now
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def _projected_keys(
    name: str, kind: str, source: Obj, data: Mapping[str, str | bytes] | None
) -> dict[str, str | bytes]:
    data = data or {}
    if not source.get("items"):
        return dict(data)
    files: dict[str, str | bytes] = {}
    for item in source["items"]:
        if item["key"] in data:
            files[item["path"]] = data[item["key"]]
        elif not source.get("optional"):
            raise VolumeError(
                f'MountVolume.SetUp failed for volume "{name}" : {kind} references '
                f"non-existent {'config' if kind == 'configmap' else 'secret'} key: {item['key']}"
            )
    return files


def _read_keys(
    core: client.CoreV1Api, namespace: str, kind: str, source: Obj
) -> dict[str, str | bytes] | None:
    """A ConfigMap's or Secret's keys (binary values decoded); None when optional and absent."""
    name = source["name"] if kind == "configmap" else source["secretName"]
    data: dict[str, str | bytes] = {}
    try:
        if kind == "configmap":
            cm = core.read_namespaced_config_map(name, namespace)
            data.update(cm.data or {})
            binary = cm.binary_data or {}
        else:
            binary = core.read_namespaced_secret(name, namespace).data or {}
    except ApiException as e:
        if e.status == 404 and source.get("optional"):
            return None
        raise VolumeError(f'{kind} "{name}" not found') from e
    data.update({k: base64.b64decode(v) for k, v in binary.items()})
    return data


def set_up(core: client.CoreV1Api, pod: Obj, pod_dir: Path) -> dict[str, VolumePath]:
    """Every volume of the pod that the fake kubelet runs, as a path on this host."""
    namespace = pod["metadata"]["namespace"]
    out: dict[str, VolumePath] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        root = pod_dir / "volumes" / name
        setup = f'MountVolume.SetUp failed for volume "{name}" : '
        if "configMap" in volume or "secret" in volume:
            kind = "configmap" if "configMap" in volume else "secret"
            source = volume["configMap"] if kind == "configmap" else volume["secret"]
            try:
                data = _read_keys(core, namespace, kind, source)
            except VolumeError as e:
                raise VolumeError(setup + str(e)) from e
            _write_files(root, _projected_keys(name, kind, source, data))
            out[name] = VolumePath(root, True)
        elif "hostPath" in volume:
            source = volume["hostPath"]
            try:
                check_host_path(source["path"], source.get("type") or "")
            except VolumeError as e:
                raise VolumeError(setup + str(e)) from e
            out[name] = VolumePath(Path(source["path"]), False)
        elif "persistentVolumeClaim" in volume:
            out[name] = _claimed_volume(core, namespace, volume)
    return out


def container_mounts(
    container: Obj, volumes: Mapping[str, VolumePath], env: Mapping[str, str]
) -> list[Mount]:
    """The container's volumeMounts as bind mounts (sub-paths made where missing)."""
    out: list[Mount] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            continue  # a kind the fake kubelet does not set up
        source = volume.path
        sub = mount.get("subPath") or ""
        if mount.get("subPathExpr"):
            sub = expand(mount["subPathExpr"], env)
        if sub:
            source = volume.path / sub
            if ".." in Path(sub).parts or Path(sub).is_absolute():
                raise SubPathError(f"subPath {sub!r} must be relative without '..'")
            if not source.resolve().is_relative_to(volume.path.resolve()):
                raise SubPathError(f"subPath {sub!r} leaves volume {mount['name']}")
            if not source.exists():
                try:
                    source.mkdir(mode=0o750, parents=True)
                except OSError as e:
                    raise SubPathError(
                        f'failed to create subPath directory for volumeMount "{mount["name"]}" '
                        f'of container "{container["name"]}": {e}'
                    ) from e
        read_only = bool(mount.get("readOnly")) or volume.read_only
        out.append(Mount(source, mount["mountPath"], read_only))
    return out


def in_mount_namespace(argv: list[str], mounts: list[Mount]) -> list[str]:
    """argv run in its own mount namespace with each mount bound (read-only where it says).

    ``unshare`` and ``sh`` exec in place, so the pod's process keeps the PID the kubelet signals.
    A file is bound onto a file, a directory onto a directory (made first where missing).
    """
    steps = []
    for m in mounts:
        src, dst = shlex.quote(str(m.source)), shlex.quote(m.target)
        if m.source.is_dir():
            make = f"mkdir -p {dst}"
        else:
            make = f"mkdir -p $(dirname {dst}) && {{ [ -e {dst} ] || : > {dst}; }}"
        step = f"{make} && mount --bind {src} {dst}"
        if m.read_only:
            step += f" && mount -o remount,bind,ro {dst}"
        steps.append(step)
    script = " && ".join([*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]
