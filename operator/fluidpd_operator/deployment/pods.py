"""Worker pods as the controller reads them (pure: no API calls): role, readiness, names, the
roles of pods to add, and one interval's view of them."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fluidpd.core.types import Role
from fluidpd_operator import resources as res
from fluidpd_operator.spec import DeploymentSpec


def rfc3339(t: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = obj["metadata"]
    return m


def pod_role(pod: dict[str, Any]) -> Role | None:
    value = meta(pod).get("labels", {}).get(res.ROLE_LABEL)
    return Role(value) if value in (Role.PREFILL.value, Role.DECODE.value) else None


def pod_ready(pod: dict[str, Any]) -> bool:
    for c in pod.get("status", {}).get("conditions", []):
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def why_not_ready(pod: dict[str, Any]) -> str:
    """What keeps a pod from running, as the scheduler or the kubelet reports it (e.g. an
    unbound claim, a model directory that fails its hostPath check), or "" when nothing says."""
    status = pod.get("status", {})
    for c in status.get("conditions", []):
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return ": ".join(x for x in (c.get("reason") or "Unschedulable", c.get("message")) if x)
    for cs in status.get("containerStatuses", []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return ": ".join(x for x in (waiting["reason"], waiting.get("message")) if x)
    return ""


def annotation(pod: dict[str, Any], key: str) -> str | None:
    value = meta(pod).get("annotations", {}).get(key)
    return str(value) if value is not None else None


def next_names(prefix: str, taken: Iterable[str], n: int) -> list[str]:
    """The ``n`` lowest free ``<prefix>-<i>`` names (stable, StatefulSet-like)."""
    used = set(taken)
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"{prefix}-{i}"
        if name not in used:
            out.append(name)
        i += 1
    return out


def roles_for_new_pods(
    n: int,
    counts: dict[Role, int],
    spec: DeploymentSpec,
    initial: bool,
    hint: Role | None,
) -> list[Role]:
    """Roles of ``n`` pods to add: the initial split on first creation; otherwise the per-role
    minimums first, then ``hint`` (the more pressured phase) or, without one, whichever role is
    furthest below its share of the initial split."""
    counts = dict(counts)
    out: list[Role] = []
    if initial and sum(counts.values()) == 0:
        p = spec.initial_prefill()
        return [Role.PREFILL] * p + [Role.DECODE] * (n - p) if n >= p else [Role.PREFILL] * n
    share = spec.initial_prefill() / spec.workers
    for _ in range(n):
        if counts[Role.PREFILL] < spec.min_prefill:
            role = Role.PREFILL
        elif counts[Role.DECODE] < spec.min_decode:
            role = Role.DECODE
        elif hint is not None:
            role = hint
        else:
            total = counts[Role.PREFILL] + counts[Role.DECODE] + 1
            role = Role.PREFILL if counts[Role.PREFILL] < share * total else Role.DECODE
        counts[role] += 1
        out.append(role)
    return out


@dataclass
class PodView:
    """The worker pods of one control interval, sorted by what they are doing."""

    pods: list[dict[str, Any]]

    @property
    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if not meta(p).get("deletionTimestamp")]

    @property
    def retiring(self) -> list[dict[str, Any]]:
        return [p for p in self.live if annotation(p, res.RETIRE)]

    @property
    def serving(self) -> list[dict[str, Any]]:
        return [p for p in self.live if not annotation(p, res.RETIRE)]

    def counts(self) -> dict[Role, int]:
        out = {Role.PREFILL: 0, Role.DECODE: 0}
        for p in self.serving:
            role = pod_role(p)
            if role is not None:
                out[role] += 1
        return out
