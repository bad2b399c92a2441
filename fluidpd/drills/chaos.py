"""Chaos under load: SIGKILL and restart random sidecars, the router and the controller of a
local stack, one at a time, for a while; after each kill the stack must be all-ready again.

A request may fail only for a cause the drill can name:

- ``decode worker killed after its first token``: it was streaming from a decode worker that
  was SIGKILLed (the router answers 502 naming the lost worker, or ends the SSE stream with
  that error);
- ``router killed mid-stream``: a streamed answer the router was relaying when it was killed
  (the client had tokens, then the connection was cut).

Everything else that fails is ``unexplained``. A request whose connection to the router was
refused or cut before any answer is sent again by the client (the OpenAI SDK does the same);
each such retry is kept with its cause, and a retry no router kill explains is unexplained too.
Requests the killed sidecar had not started must be re-paired elsewhere by the router: they
complete.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from fluidpd import procs
from fluidpd.drills.admin import admin_session, router_workers
from fluidpd.drills.load import OpenLoopLoad, Outcome
from fluidpd.procs import alive

#: After a router kill, a client retry within this long of its restart is the kill's doing.
ROUTER_RETRY_GRACE_S = 3.0

DECODE_LOST = "decode worker killed after its first token"
ROUTER_CUT = "router killed mid-stream"
UNEXPLAINED = "unexplained"


class Processes:
    """Kills and restarts the components of a ``fluidpd up`` run directory by name (``w0``,
    ``router``, ``controller``), from the command line ``up`` wrote for each; a restarted one is
    this process's child (it dies with it) and logs to the same file."""

    def __init__(self, run_dir: Path, token: str | None) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, **({"FLUIDPD_ADMIN_TOKEN": token} if token else {})}
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def pid(self, name: str) -> int:
        return int((self.run_dir / f"{name}.pid").read_text())

    def kill(self, name: str, timeout: float = 10.0) -> None:
        child = self.children.pop(name, None)
        if child is not None:
            child.kill()
            child.wait(timeout)
            return
        pid = self.pid(name)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while alive(pid):  # a zombie (``up`` has not reaped it) counts as gone
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} (pid {pid}) survived SIGKILL")
            time.sleep(0.02)

    def restart(self, name: str) -> None:
        argv = shlex.split((self.run_dir / f"{name}.cmd").read_text())
        # Started from the event loop's thread, which lives as long as the drill; the log
        # goes on after the killed process's.
        proc = procs.spawn(argv, self.run_dir / f"{name}.log", env=self.env)
        (self.run_dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        self.children[name] = proc

    def stop(self, timeout: float = 20.0) -> None:
        """Stops the restarted components the way ``up`` stops its own: controller, router,
        then the sidecars."""
        order = sorted(self.children, key=lambda n: {"controller": 0, "router": 1}.get(n, 2))
        procs.stop([self.children[name] for name in order], timeout)
        self.children.clear()


@dataclass(slots=True)
class Kill:
    t: float
    target: str
    #: "prefill sidecar", "decode sidecar", "router" or "controller".
    kind: str
    #: The sidecar's state and load at the kill (the router's last view).
    state: str = ""
    batch: int = 0
    queue_len: int = 0
    #: Client requests outstanding at the kill.
    in_flight: int = 0
    #: The role switch the drill started just before this kill ("" if none), e.g.
    #: "w3 decode->prefill (migrate)", and how the killed component took part in it.
    during_switch: str = ""
    switch_part: str = ""
    restarted_s: float = 0.0
    #: Kill to all-ready (None: not ready within the limit).
    ready_s: float | None = None
    not_ready: str = ""


async def _ok(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def not_ready(
    session: aiohttp.ClientSession,
    endpoint: str,
    workers: dict[str, str],
    controller_metrics: str | None,
) -> str:
    """Why the stack is not all-ready ("" when it is): the router answers, sees every worker
    reachable and Active (with a prefill and a decode pool), every sidecar is ready, and the
    controller serves its metrics."""
    if not await _ok(session, f"{endpoint}/healthz"):
        return "router down"
    try:
        seen = {w["worker"]: w for w in await router_workers(session, endpoint)}
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
        return f"router stats: {exc}"
    for wid in workers:
        w = seen.get(wid)
        if w is None or not w["healthy"]:
            return f"router: {wid} not reachable"
        if w["state"] != "active":
            return f"router: {wid} {w['state']}"
    roles = {w["role"] for w in seen.values()}
    if not {"prefill", "decode"} <= roles:
        return f"router: roles {sorted(r for r in roles if r)}"
    for wid, url in workers.items():
        if not await _ok(session, f"{url}/readyz"):
            return f"{wid} not ready"
    if controller_metrics and not await _ok(session, controller_metrics):
        return "controller down"
    return ""


async def wait_ready(
    session: aiohttp.ClientSession,
    endpoint: str,
    workers: dict[str, str],
    controller_metrics: str | None,
    timeout_s: float,
) -> str:
    """Polls until all-ready; returns "" or the last reason it was not."""
    deadline = time.time() + timeout_s
    why = "never checked"
    while time.time() < deadline:
        why = await not_ready(session, endpoint, workers, controller_metrics)
        if not why:
            return ""
        await asyncio.sleep(0.1)
    return why


def _up_again(name: str, workers: dict[str, str], endpoint: str, metrics: str | None) -> str:
    if name == "router":
        return f"{endpoint}/healthz"
    if name == "controller":
        return metrics or ""
    return f"{workers[name]}/readyz"


_LOST = re.compile(r"decode worker (\S+) was lost mid-stream")


def _killed_during(o: Outcome, target: str, kills: list[Kill]) -> bool:
    """``target`` was killed while the request ran. From its start, also for a stream cut
    after its first token: the drill kills on the client's own event loop, so tokens the
    router sent before the kill may be read, and the first token stamped, only after it."""
    return any(k.target == target and o.start <= k.t <= o.end for k in kills)


def classify(o: Outcome, kills: list[Kill]) -> str:
    """The cause of a failed request (see the module's docstring)."""
    lost = _LOST.search(o.error)
    if lost and _killed_during(o, lost.group(1), kills):
        return DECODE_LOST
    cut = o.stream and o.first_token and ("Error" in o.error or "without [DONE]" in o.error)
    if cut and _killed_during(o, "router", kills):
        return ROUTER_CUT
    return UNEXPLAINED


def retry_cause(t: float, kills: list[Kill]) -> str:
    """A client retry at ``t`` is the router's kill's doing if the router was down then."""
    for k in kills:
        back = k.t + (k.ready_s if k.ready_s is not None else 120.0)
        if k.target == "router" and k.t - 0.5 <= t <= back + ROUTER_RETRY_GRACE_S:
            return "router killed"
    return UNEXPLAINED


def _dist(xs: list[float]) -> dict[str, float | int]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "mean_s": round(statistics.fmean(xs), 3),
        "p50_s": round(statistics.median(xs), 3),
        "max_s": round(max(xs), 3),
    }


def summarize(outcomes: list[Outcome], kills: list[Kill], hang_s: float) -> dict[str, Any]:
    done = [o for o in outcomes if o.end]
    failed = [o for o in done if not o.ok]
    causes = Counter(classify(o, kills) for o in failed)
    unexplained = Counter(o.error or f"HTTP {o.status}" for o in failed
                          if classify(o, kills) == UNEXPLAINED)  # fmt: skip
    retries = [(t, e) for o in outcomes for t, e in o.retries]
    retry_causes = Counter(retry_cause(t, kills) for t, _ in retries)
    unexplained_retries = Counter(e for t, e in retries if retry_cause(t, kills) == UNEXPLAINED)
    return {
        "sent": len(outcomes),
        "streamed": sum(1 for o in outcomes if o.stream),
        "completed": sum(1 for o in done if o.ok),
        "completed_after_client_retry": sum(1 for o in done if o.ok and o.retries),
        "failed": len(failed),
        "failed_by_cause": dict(causes),
        "unexplained_failures": dict(unexplained),
        "hung": sum(1 for o in outcomes if not o.end or o.end - o.start > hang_s),
        "client_retries": len(retries),
        "client_retries_by_cause": dict(retry_causes),
        "unexplained_retries": dict(unexplained_retries),
    }


def per_kill(outcomes: list[Outcome], k: Kill) -> dict[str, Any]:
    """The requests outstanding at one kill and how they ended."""
    hit = [o for o in outcomes if o.start <= k.t and (not o.end or o.end >= k.t)]
    return {
        **asdict(k),
        "in_flight": len(hit),
        "in_flight_completed": sum(1 for o in hit if o.ok),
        "in_flight_failed": sum(1 for o in hit if o.end and not o.ok),
    }


async def _idle(
    session: aiohttp.ClientSession, workers: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """After the load: every sidecar empties (nothing orphaned by a kill); what is left."""
    deadline = time.time() + timeout_s
    left: dict[str, Any] = {}
    while True:
        left = {}
        for wid, url in workers.items():
            try:
                async with session.get(f"{url}/pressure") as resp:
                    p = await resp.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                left[wid] = f"unreachable: {exc}"
                continue
            if not p["drained"] or p["kv_reserved"] or p["kv_used"]:
                keys = ("role", "state", "batch", "queue_len", "kv_used", "kv_reserved")
                left[wid] = {k: p[k] for k in keys}
        if not left or time.time() > deadline:
            return left
        await asyncio.sleep(0.5)


_SWITCH_DONE = re.compile(r"switch (\w+) -> (\w+) done in ([0-9.]+) s")


def switches_logged(run_dir: Path) -> dict[str, Any]:
    """The role switches the sidecars finished during the drill (their logs; the sidecars'
    own counters restart with them)."""
    done: list[tuple[str, float]] = []
    for log in sorted(run_dir.glob("w*.log")):
        for m in _SWITCH_DONE.finditer(log.read_text(errors="replace")):
            done.append((f"{m.group(1)}->{m.group(2)}", float(m.group(3))))
    return {
        "n": len(done),
        "by_direction": dict(Counter(d for d, _ in done)),
        "drain": _dist([s for _, s in done]),
    }


async def start_switch(
    session: aiohttp.ClientSession,
    seen: dict[str, dict[str, Any]],
    rng: random.Random,
) -> tuple[str, str, list[str]] | None:
    """Asks a random Active worker of a pool with two or more to switch (D->P with drain
    ``migrate``, so in-flight requests move to the other decode workers); returns (worker,
    description, its migration targets), or None if no pool can spare one."""
    active = {w: i for w, i in seen.items() if i["state"] == "active" and i["healthy"]}
    pools = {r: sorted(w for w, i in active.items() if i["role"] == r)
             for r in ("prefill", "decode")}  # fmt: skip
    sources = [r for r, ws in pools.items() if len(ws) >= 2]
    if not sources:
        return None
    source = rng.choice(sources)
    victim = rng.choice(pools[source])
    target = "decode" if source == "prefill" else "prefill"
    drain = "migrate" if source == "decode" else "wait"
    peers = [w for w in pools["decode"] if w != victim]
    body = {"role": target, "drain": drain, "migrate_to": [active[w]["url"] for w in peers]}
    try:
        async with session.post(
            f"{active[victim]['url']}/role", json=body, timeout=aiohttp.ClientTimeout(total=5.0)
        ) as resp:
            if resp.status != 200:
                return None
    except (aiohttp.ClientError, TimeoutError):
        return None
    return victim, f"{victim} {source}->{target} ({drain})", peers if drain == "migrate" else []


def _kind(target: str, seen: dict[str, dict[str, Any]]) -> str:
    if target in ("router", "controller"):
        return target
    role = seen.get(target, {}).get("role") or "?"
    return f"{role} sidecar"


async def chaos_drill(
    run_dir: Path,
    endpoint: str,
    workers: dict[str, str],
    token: str | None,
    model: str,
    duration_s: float = 600.0,
    rps: float = 4.0,
    gap_s: tuple[float, float] = (2.0, 6.0),
    weights: dict[str, float] | None = None,
    controller_metrics: str | None = None,
    stream_share: float = 0.25,
    switch_share: float = 0.4,
    max_tokens: tuple[int, int] = (10, 200),
    ready_timeout_s: float = 120.0,
    hang_s: float = 120.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Kills until ``duration_s`` has passed (the first kills cover a prefill and a decode
    sidecar, the router and, if there is one, the controller), then lets the load drain.

    ``weights``: relative odds of "sidecar", "router", "controller" for each later kill.
    ``switch_share``: the share of kills made right after the drill itself started a role
    switch; the kill then hits the switching worker, one of its migration targets, the router
    or the controller (a kill in the middle of a drain or a migration)."""
    rng = random.Random(seed)
    weights = weights or {"sidecar": 3.0, "router": 1.0, "controller": 1.0}
    if not controller_metrics:
        weights = {k: v for k, v in weights.items() if k != "controller"}
    procs = Processes(run_dir, token)
    load = OpenLoopLoad(
        endpoint, model, rps, seed=seed, request_timeout_s=hang_s, max_tokens=max_tokens,
        stream_share=stream_share, retry_unanswered_s=hang_s,
    )  # fmt: skip
    stop = asyncio.Event()
    kills: list[Kill] = []
    first: list[str] = ["prefill", "decode", "router"] + (
        ["controller"] if controller_metrics else []
    )
    rng.shuffle(first)
    load_task = asyncio.create_task(load.run(duration_s + 3600.0, stop))
    t_end = time.time() + duration_s
    try:
        async with admin_session(token) as session:
            why = await wait_ready(session, endpoint, workers, controller_metrics, ready_timeout_s)
            if why:
                raise RuntimeError(f"the stack is not ready before the first kill: {why}")
            await asyncio.sleep(3.0)  # load on every worker
            while time.time() < t_end or first:  # the first kills cover every kind
                seen = {w["worker"]: w for w in await router_workers(session, endpoint)}
                target = _pick(rng, first.pop(0) if first else None, weights, seen)
                switch = None
                if not first and rng.random() < switch_share:
                    switch = await start_switch(session, seen, rng)
                part = ""
                if switch is not None:
                    victim, _, peers = switch
                    parts = {"switching worker": [victim], "migration target": peers,
                             "router": ["router"], "controller": ["controller"]}  # fmt: skip
                    if not controller_metrics:
                        del parts["controller"]
                    choices = [p for p, ws in parts.items() if ws]
                    part = rng.choice(choices)
                    target = rng.choice(parts[part])
                    await asyncio.sleep(rng.uniform(0.0, 0.3))  # into the drain
                k = Kill(time.time(), target, _kind(target, seen))
                if switch is not None:
                    k.during_switch, k.switch_part = switch[1], part
                if target in seen:
                    k.state = str(seen[target]["state"])
                    k.batch, k.queue_len = (
                        int(seen[target]["batch"]),
                        int(seen[target]["queue_len"]),
                    )
                k.in_flight = sum(1 for o in load.report.outcomes if not o.end)
                k.t = time.time()
                procs.kill(target)
                procs.restart(target)
                url = _up_again(target, workers, endpoint, controller_metrics)
                while url and not await _ok(session, url):
                    if time.time() - k.t > ready_timeout_s:
                        break
                    await asyncio.sleep(0.05)
                k.restarted_s = round(time.time() - k.t, 3)
                k.not_ready = await wait_ready(
                    session, endpoint, workers, controller_metrics,
                    max(1.0, ready_timeout_s - (time.time() - k.t)),
                )  # fmt: skip
                if not k.not_ready:
                    k.ready_s = round(time.time() - k.t, 3)
                kills.append(k)
                await asyncio.sleep(rng.uniform(*gap_s))
            stop.set()
            report = await load_task
            final = await wait_ready(session, endpoint, workers, controller_metrics, 60.0)
            leftover = await _idle(session, workers, 30.0)
    finally:
        stop.set()
        if not load_task.done():
            load_task.cancel()
        procs.stop()
    ready = [k.ready_s for k in kills if k.ready_s is not None]
    by_kind: dict[str, list[float]] = {}
    for k in kills:
        if k.ready_s is not None:
            by_kind.setdefault(k.kind, []).append(k.ready_s)
    return {
        "duration_s": duration_s,
        "rps": rps,
        "stream_share": stream_share,
        "requests": summarize(report.outcomes, kills, hang_s),
        "kills": {
            "n": len(kills),
            "by_kind": dict(Counter(k.kind for k in kills)),
            "not_ready_after": sum(1 for k in kills if k.ready_s is None),
            "time_to_ready": _dist(ready),
            "during_a_switch": dict(Counter(k.switch_part for k in kills if k.during_switch)),
            "time_to_ready_by_kind": {kind: _dist(xs) for kind, xs in sorted(by_kind.items())},
        },
        "role_switches": switches_logged(run_dir),
        "final_not_ready": final,
        "work_left_on_sidecars": leftover,
        "each_kill": [per_kill(report.outcomes, k) for k in kills],
    }


def _pick(
    rng: random.Random, forced: str | None, weights: dict[str, float], seen: dict[str, Any]
) -> str:
    """The next component to kill: a forced kind first, else by ``weights``."""
    kind = forced or rng.choices(list(weights), list(weights.values()))[0]
    if kind in ("router", "controller"):
        return kind
    pool = sorted(seen) if kind == "sidecar" else sorted(
        w for w, info in seen.items() if info["role"] == kind
    )  # fmt: skip
    return rng.choice(pool or sorted(seen))
