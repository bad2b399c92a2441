"""Drain ``migrate``: a draining decode worker moves its running requests to peers
(``fluidpd.core.migration.plan_migration`` chooses which and where), and a peer adopts them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fluidpd.api.internal import Abort, Adopt, DecodeEvent
from fluidpd.core.migration import Peer, plan_migration
from fluidpd.core.signals import allocatable_kv
from fluidpd.core.types import Role, RoleState
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound
from fluidpd_sidecar.halves import DecodeState, check_half
from fluidpd_sidecar.intake import Intake
from fluidpd_sidecar.peers import PeerError
from fluidpd_sidecar.transfer import KVDest

log = logging.getLogger("fluidpd.sidecar")


class Migration(Intake):
    """Migrating requests out (source) and adopting them in (target)."""

    @property
    def _moves_kv(self) -> bool:
        """The engine's decode KV travels with a migrated request (real bytes; the ``sim``
        engine's outputs need none, so it moves only the modelled time)."""
        return hasattr(self.engine, "export_decode") and self.transfer.arena_bytes > 0

    def adopt(self, body: Adopt) -> KVDest | None:
        """Takes over a request migrating in; returns where its KV is to be written."""
        self._check_accepting(Role.DECODE)
        if not getattr(self.engine, "migrates_kv", True):
            raise Conflict(f"engine {self.engine.name} cannot adopt a request without its KV")
        half = body.half
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        if half.rid in self.decode_halves or half.rid in self._unclaimed:
            raise Conflict(f"request {half.rid} is already here")
        state = self._decode_state(half, body.output_ids)
        state.req.first_token_t = body.first_token_t
        if not self.worker.decode.adopt(state.req, body.generated):
            self.engine.release(half.rid)
            raise Conflict(f"no KV room for request {half.rid}")
        if self._moves_kv:
            tokens = half.prompt_len + body.generated - 1
            state.dest = self.transfer.reserve(self.engine.kv_wire_bytes(tokens))
            if state.dest is None:
                self.worker.decode.cancel(half.rid)
                self.engine.release(half.rid)
                raise Conflict(f"no KV transport room for request {half.rid}")
        state.started = True
        self.decode_halves[half.rid] = state
        log.info("request %d adopted (migrating in after %d tokens)", half.rid, body.generated)
        return state.dest

    def activate(self, rid: int) -> None:
        half = self.decode_halves.get(rid)
        if half is None or rid not in self.worker.decode.migrating_in:
            raise NotFound(f"no adopted request {rid} here")
        if half.dest is not None:
            view = getattr(self.transfer, "view")  # noqa: B009 - byte-moving transports only
            self.metrics.kv_received.labels(self.cfg.worker_id).inc(half.dest.nbytes)
            self._verify_kv(half)
            try:
                self.engine.import_decode(rid, view(half.dest.addr, half.dest.nbytes))  # type: ignore[attr-defined]
            except ValueError as exc:
                self.worker.decode.cancel(rid)
                self._end_decode(rid, DecodeEvent(event="error", detail=f"KV import: {exc}"))
                raise BadRequest(str(exc)) from exc
        self.worker.decode.activate(rid)
        self.wake()

    async def _peer_room(self) -> list[Peer]:
        """The migration peers that are Active decode workers now, with their free KV."""
        room = []
        for url in self._migrate_to:
            try:
                p = await self.peers.get(url, "/pressure")
            except PeerError:
                continue
            if p.get("role") != Role.DECODE.value or p.get("state") != RoleState.ACTIVE.value:
                continue
            free = allocatable_kv(int(p["kv_capacity"]), int(p["kv_used"]), int(p["kv_reserved"]))
            # Its running-request limit is not in /pressure: its adopt answers 409 when full.
            room.append(Peer(url, free, 1 << 30))
        return room

    async def _migrate_out(self) -> None:
        d = self.worker.decode
        if not d.migrate_on_drain or not d.active or d.running is not None:
            return
        move_s = self.cfg.profile.transfer_model().time
        plan = plan_migration(d.migrants(move_s), await self._peer_room(), d.step_s())
        moves: list[tuple[int, str, DecodeState, Adopt]] = []
        for rid, target in plan:
            half = self.decode_halves.get(rid)
            slot = d.active.get(rid)
            if half is None or slot is None or d.running is not None:
                continue
            generated = slot.generated(d.iteration)
            if self._advance(half, generated):
                d.finish_early(rid, time.time())  # it stopped: it finishes here instead
                self._dispatch()
                continue
            self._emit(half, time.time())
            body = Adopt(
                half=half.half,
                generated=generated,
                output_ids=half.stream.output_ids,
                first_token_t=half.req.first_token_t,
            )
            moves.append((rid, target, half, body))
        # Every adoption of the plan at once: the drain pays one round trip, not one per
        # request (no step runs meanwhile: this is the scheduler's own task).
        answers = await asyncio.gather(
            *(self.peers.post(target, "/v1/internal/adopt", body) for _, target, _, body in moves),
            return_exceptions=True,
        )
        for (rid, target, half, _), answer in zip(moves, answers, strict=True):
            if isinstance(answer, BaseException):
                log.info("migration of %d to %s refused: %s", rid, target, answer)
                continue
            if rid not in d.active:
                # Finished or aborted while we asked: the adopted copy must not decode alone.
                self._spawn(self._abort_peer(target, rid, "migration source ended it"))
                continue
            req, generated = d.detach(rid)
            nbytes = d.migration_bytes(req, generated)
            dest = None
            if answer.get("kv_nbytes"):
                dest = KVDest(
                    answer["kv_session"], int(answer["kv_addr"]), int(answer["kv_nbytes"])
                )
            detach = getattr(self.engine, "detach", None)
            if detach is not None:
                detach(rid)  # out of the engine's next step: its KV must not grow while copied
            self.decode_halves.pop(rid, None)
            self._spawn(self._move(half, target, nbytes, dest, generated))

    async def _move(
        self, half: DecodeState, target: str, nbytes: int, dest: KVDest | None, generated: int
    ) -> None:
        rid = half.req.rid
        try:
            if dest is not None and self._moves_kv:
                region = await self.engine.export_decode(rid, generated)  # type: ignore[attr-defined]
                await self.transfer.send(region.addr, dest, region.nbytes)
                self.metrics.kv_sent.labels(self.cfg.worker_id).inc(region.nbytes)
            else:
                await self.transfer.send(None, None, nbytes)
            await self.peers.post(
                target, "/v1/internal/activate", Abort(rid=rid, reason="migrated")
            )
            self._push(half, DecodeEvent(event="migrated", url=target, n=half.fed))
            log.info("request %d migrated to %s after %d tokens", rid, target, half.fed)
        except Exception as exc:
            log.warning("request %d failed: migration to %s failed: %s", rid, target, exc)
            self._push(half, DecodeEvent(event="error", detail=f"migration failed: {exc}"))
            await self._abort_peer(target, rid, "migration failed")
        finally:
            half.closed = True
            half.events.put_nowait(None)
            self.engine.release(rid)
            self.wake()

    async def _abort_peer(self, url: str, rid: int, reason: str) -> None:
        try:
            await self.peers.post(url, "/v1/internal/abort", Abort(rid=rid, reason=reason))
        except PeerError as exc:
            log.info("abort of %d on %s not delivered: %s", rid, url, exc)
