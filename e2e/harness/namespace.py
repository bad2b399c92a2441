"""Throw-away namespaces on the test plane (the ``namespace`` fixture's and the drills')."""

from __future__ import annotations

import re
import uuid
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.wait import wait_for


def create_namespace(api: Any, prefix: str) -> str:
    """A fresh namespace named after ``prefix`` (made DNS-safe) plus a random suffix, labelled
    as the e2e's, once its ``default`` ServiceAccount exists. Returns its name."""
    core = client.CoreV1Api(api)
    slug = re.sub(r"[^a-z0-9]+", "-", prefix.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"fluidpd.io/e2e": "true"}}})
    # The ServiceAccount admission plugin rejects pods until the namespace's `default` exists.
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )
    return name


def delete_namespace(api: Any, name: str) -> None:
    """Deletes the namespace and waits until its pods are gone (not for the namespace object:
    the namespace controller takes its time over the empty husk, in the background)."""
    core = client.CoreV1Api(api)
    try:
        # Pods first, directly: the namespace controller gets to them only after a while.
        core.delete_collection_namespaced_pod(name)
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
    # Leave no pod processes behind for whatever runs next.
    wait_for(
        lambda: not core.list_namespaced_pod(name).items,
        timeout=120,
        what=f"the pods of namespace {name} to be deleted",
    )
