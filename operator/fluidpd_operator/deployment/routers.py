"""Router sync: every ready router gets the live worker set (re-sent on change and every
``ROUTER_RESYNC_S``, since a restarted router starts empty), and a poke when a switch starts or
finishes."""

from __future__ import annotations

import logging
import time

import aiohttp
import orjson

from fluidpd_operator import resources as res
from fluidpd_operator.deployment.pods import meta, pod_ready, pod_role
from fluidpd_operator.deployment.state import DeploymentState

log = logging.getLogger("fluidpd.operator")

#: Re-send the router its worker set at least this often (a restarted router starts empty).
ROUTER_RESYNC_S = 10.0


class RouterSync(DeploymentState):
    async def sync_routers(self) -> None:
        selector = res.selector_string({
            res.DEPLOYMENT_LABEL: self.name, res.COMPONENT_LABEL: "router"
        })  # fmt: skip
        routers = await self.kube.list_pods(self.namespace, selector)
        workers = {
            meta(p)["name"]: url
            for p in self.view.live
            if (url := self.url(p)) is not None and pod_role(p) is not None
        }
        payload = orjson.dumps({"workers": dict(sorted(workers.items()))})
        now = time.monotonic()
        alive = set()
        self._router_urls = []
        for r in routers:
            ip = r.get("status", {}).get("podIP")
            if not ip or not pod_ready(r) or meta(r).get("deletionTimestamp"):
                continue
            uid = meta(r)["uid"]
            alive.add(uid)
            self._router_urls.append(f"http://{ip}:{self.spec.router.port}")
            last = self._router_sync.get(uid)
            if last and last[1] == payload and now - last[0] < ROUTER_RESYNC_S:
                continue
            url = f"http://{ip}:{self.spec.router.port}/admin/workers"
            try:
                async with self.session.put(
                    url, data=payload, headers=self.headers, timeout=aiohttp.ClientTimeout(total=3)
                ) as resp:
                    if resp.status == 200:
                        self._router_sync[uid] = (now, payload)
                    else:
                        log.warning("router %s: %s", meta(r)["name"], resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("router %s unreachable: %s", meta(r)["name"], exc)
        self._router_sync = {k: v for k, v in self._router_sync.items() if k in alive}
        self.routers_ready = len(alive)

    async def poke_routers(self) -> None:
        """A switch started or finished: the routers re-read every worker now, not at their
        next poll."""
        for base in self._router_urls:
            try:
                async with self.session.post(
                    f"{base}/admin/poll", headers=self.headers, timeout=aiohttp.ClientTimeout(2)
                ):
                    pass
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("router %s: %s", base, exc)
