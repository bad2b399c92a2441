"""A small async face over the official ``kubernetes`` client, speaking plain JSON dicts.

Objects travel as the API server's own JSON (camelCase dicts, the same shape the manifest
builders produce), so nothing is converted twice. The blocking client runs in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


def load_config() -> kubernetes.client.ApiClient:
    """In-cluster credentials when running in a pod, the kubeconfig otherwise."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def _core(kind: str) -> str:
    return {
        "Pod": "pods",
        "Service": "services",
        "Secret": "secrets",
        "ConfigMap": "configmaps",
        "Event": "events",
    }[kind]


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    if api_version == "v1":
        base = f"/api/v1/namespaces/{namespace}/{_core(kind)}"
    elif kind == "Deployment":
        base = f"/apis/{api_version}/namespaces/{namespace}/deployments"
    else:
        raise ValueError(f"no path for {api_version} {kind}")
    return f"{base}/{name}" if name else base


class Kube:
    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    def _call_sync(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        try:
            resp = self.client.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
        except ApiException as exc:
            reason = exc.reason or ""
            with contextlib.suppress(TypeError, ValueError, KeyError):
                reason = json.loads(exc.body)["message"]
            raise KubeError(exc.status or 0, reason) from None
        data = resp.data
        return json.loads(data) if data else {}

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self._call_sync, method, path, body, query, content_type)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        got = await self.call(
            "GET", path_of("v1", "Pod", namespace), query=[("labelSelector", selector)]
        )
        items: list[dict[str, Any]] = got.get("items", [])
        return items

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return await self.call("GET", path_of(api_version, kind, namespace, name))

    async def create(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", path_of(obj["apiVersion"], obj["kind"], namespace), obj)

    async def ensure(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj``, or merge its metadata labels and spec into the live one."""
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], namespace, meta["name"])
        try:
            return await self.create(namespace, obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
        patch: dict[str, Any] = {"metadata": {"labels": meta.get("labels", {})}}
        if "spec" in obj:
            patch["spec"] = obj["spec"]
        return await self.call("PATCH", path, patch, content_type=MERGE_PATCH)

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        path = path_of(api_version, kind, namespace, name)
        return await self.call("PATCH", path, patch, content_type=MERGE_PATCH)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        body = {"preconditions": {"uid": uid}}
        try:
            await self.call("DELETE", path_of("v1", "Pod", namespace, name), body)
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise

    async def patch_status(
        self, resource: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge ``status`` into the status subresource (``resource``: group/version/plural)."""
        group_version, plural = resource.rsplit("/", 1)
        path = f"/apis/{group_version}/namespaces/{namespace}/{plural}/{name}/status"
        await self.call("PATCH", path, {"status": status}, content_type=MERGE_PATCH)


def event_manifest(
    obj: dict[str, Any], reason: str, message: str, type_: str, now: str
) -> dict[str, Any]:
    """A core/v1 Event about ``obj`` (what ``kubectl describe`` and ``kubectl events`` show)."""
    meta = obj["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "fluidpd-operator"},
        "reportingComponent": "fluidpd.io/operator",
        "reportingInstance": "fluidpd-operator",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
