"""Drain ``migrate``: a draining decode worker moves its running requests to peers
(``fluidpd.core.migration.plan_migration`` chooses which and where), and a peer adopts them.

A move with real KV (the ``gpu`` engine) is: the adoption (the peer reserves KV pages; every
adoption of a plan is sent at once), the export (the engine copies the request's KV pages into
a staging slot of this worker's transport arena; exports submitted together run as one engine
job), then either *pull* (``shm``, ``cuda-ipc``: the peer reads the slot in place during
``activate`` and loads it into its pages, batched likewise, and answers when done) or *push*
(``mooncake``: the peer reserved room in its own arena, the transport writes there, then
``activate``). Pull needs no arena room on the peer - with push, 32 requests of 270 MiB each
waited for a peer arena of 3-4 GiB in rounds - and ``shm`` copies the bytes once, not three
times. Where the time went is kept in a ``DrainReport`` (``GET /role``'s ``last_drain``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from fluidpd.api.internal import Abort, Activate, Adopt, DecodeEvent
from fluidpd.core.migration import Peer, plan_migration
from fluidpd.core.signals import allocatable_kv
from fluidpd.core.types import Role, RoleState
from fluidpd_sidecar.arena import TransferError
from fluidpd_sidecar.engine import kv_stamp
from fluidpd_sidecar.errors import BadRequest, Conflict, NotFound
from fluidpd_sidecar.halves import DecodeState, check_half
from fluidpd_sidecar.intake import Intake
from fluidpd_sidecar.peers import PeerError
from fluidpd_sidecar.transfer import KVDest, PullTransfer, can_pull

log = logging.getLogger("fluidpd.sidecar")


class Migration(Intake):
    """Migrating requests out (source) and adopting them in (target)."""

    @property
    def _moves_kv(self) -> bool:
        """The engine's decode KV travels with a migrated request (real bytes; the ``sim``
        engine's outputs need none, so it moves only the modelled time)."""
        return hasattr(self.engine, "export_decode") and self.transfer.arena_bytes > 0

    @property
    def _pulls_kv(self) -> bool:
        """This worker's transport reads a peer's staged KV in place (see the module)."""
        return self._moves_kv and can_pull(self.transfer)

    @property
    def output_vocab(self) -> int:
        """The ids a migrating request's output tokens can have: the engine's vocabulary (they
        are what its sampler chose, and may lie past the served tokenizer's: the gpu engine's
        named shapes with the embedded tokenizer, 128,256 ids for llama-3.1-8b against 1,024;
        the source detokenized them all the same), else the served model's."""
        return int(getattr(self.engine, "vocab_size", 0)) or self.cfg.model.vocab_size

    def adopt(self, body: Adopt) -> KVDest | None:
        """Takes over a request migrating in; returns where its KV is to be written (None: it
        moves no bytes, or this worker will pull them, see ``pulls``)."""
        self._check_accepting(Role.DECODE)
        if not getattr(self.engine, "migrates_kv", True):
            raise Conflict(f"engine {self.engine.name} cannot adopt a request without its KV")
        half = body.half
        check_half(half, self.cfg.context_limit, self.cfg.model.vocab_size)
        vocab = self.output_vocab
        if body.output_ids and (min(body.output_ids) < 0 or max(body.output_ids) >= vocab):
            raise BadRequest(f"output_ids: token ids must be in [0, {vocab})")
        if half.rid in self.decode_halves or half.rid in self._unclaimed:
            raise Conflict(f"request {half.rid} is already here")
        # The core first: a refusal books room for the request (it comes back next round of
        # its source's drain), before the engine admits anything.
        req = self._request_of(half)
        req.first_token_t = body.first_token_t
        if not self.worker.decode.adopt(req, body.generated, time.time()):
            self.wake()  # the scheduler sleeps until the booking lapses, not forever
            raise Conflict(f"no KV room for request {half.rid} now (room booked for it)")
        try:
            state = self._decode_state(half, body.output_ids, req)
        except BadRequest:
            self.worker.decode.cancel(half.rid)
            raise
        if self._moves_kv and not (body.kv_pull and self._pulls_kv):
            tokens = half.prompt_len + body.generated - 1
            state.dest = self.transfer.reserve(self.engine.kv_wire_bytes(tokens))
            if state.dest is None:
                self.worker.decode.cancel(half.rid)
                self.engine.release(half.rid)
                raise Conflict(f"no KV transport room for request {half.rid}")
        state.started = True
        self._add_decode_half(state)
        log.info("request %d adopted (migrating in after %d tokens)", half.rid, body.generated)
        return state.dest

    def pulls(self, rid: int) -> bool:
        """The adopted request ``rid`` has its KV pulled here (no room was reserved for it)."""
        half = self.decode_halves.get(rid)
        return half is not None and half.dest is None and self._pulls_kv

    async def activate(self, body: Activate) -> None:
        rid = body.rid
        half = self.decode_halves.get(rid)
        if half is None or rid not in self.worker.decode.migrating_in:
            raise NotFound(f"no adopted request {rid} here")
        if body.kv_nbytes and self.pulls(rid):
            await self._pull(half, body)
            if rid not in self.worker.decode.migrating_in:  # aborted while it loaded
                raise NotFound(f"adopted request {rid} ended while its KV loaded")
        elif half.dest is not None:
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

    async def _pull(self, half: DecodeState, body: Activate) -> None:
        """Reads the migrated KV in the source's slot and loads it into the engine's pages."""
        rid = half.req.rid
        transfer: PullTransfer = self.transfer  # type: ignore[assignment]
        try:
            with transfer.peer_view(body.kv_session or "", body.kv_addr, body.kv_nbytes) as view:
                if bytes(view[:8]) != kv_stamp(rid):
                    self.metrics.kv_corrupt()
                    raise ValueError(f"the KV in the source's slot is not request {rid}'s")
                await self.engine.load_decode(rid, view)  # type: ignore[attr-defined]
        except (ValueError, TransferError) as exc:
            self.worker.decode.cancel(rid)
            self._end_decode(rid, DecodeEvent(event="error", detail=f"KV import: {exc}"))
            raise BadRequest(str(exc)) from exc
        self.metrics.kv_received.labels(self.cfg.worker_id).inc(body.kv_nbytes)

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
        plan = plan_migration(d.migrants(move_s), await self._peer_room(), d.step_s(), self._barred)
        report = self._drain_report
        if plan.asks:
            report.rounds += 1
        moves: list[tuple[int, str, DecodeState, Adopt]] = []
        for rid, target in plan.asks:
            half = self.decode_halves.get(rid)
            slot = d.active.get(rid)
            if half is None or slot is None or d.running is not None:
                continue
            generated = slot.generated(d.iteration)
            if self._advance(half, generated):
                d.finish_early(rid, time.time())  # it stopped: it finishes here instead
                self._dispatch()
                report.finished_here += 1
                continue
            self._emit(half, time.time())
            body = Adopt(
                half=half.half,
                generated=generated,
                output_ids=half.stream.output_ids,
                first_token_t=half.req.first_token_t,
                kv_pull=self._pulls_kv,
            )
            moves.append((rid, target, half, body))
        if not moves:
            return
        # Every adoption of the plan at once: the drain pays one round trip, not one per
        # request (no step runs meanwhile: this is the scheduler's own task).
        t0 = time.time()
        if not report.first_adopt_s:
            report.first_adopt_s = round(t0 - self._drain_started, 4)
        answers = await asyncio.gather(
            *(self.peers.post(target, "/v1/internal/adopt", body) for _, target, _, body in moves),
            return_exceptions=True,
        )
        report.adopt_s += time.time() - t0
        for (rid, target, half, _), answer in zip(moves, answers, strict=True):
            if isinstance(answer, BaseException):
                report.refused += 1
                if isinstance(answer, PeerError) and answer.status == 400:
                    # Not a matter of room: asking again would be refused again, every round
                    # of the drain. It finishes here unless another peer takes it.
                    self._barred.add((rid, target))
                    log.warning("migration of %d to %s refused for good: %s", rid, target, answer)
                elif (rid, target) in plan.bookings:  # expected: the refusal books room
                    log.debug("migration of %d to %s booked: %s", rid, target, answer)
                else:
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
            report.last_detached_s = round(time.time() - self._drain_started, 4)
            pull = bool(answer.get("kv_pull")) and dest is None and self._pulls_kv
            self._moving += 1
            self._spawn(self._move(half, target, nbytes, dest, generated, pull))

    async def _move(
        self,
        half: DecodeState,
        target: str,
        nbytes: int,
        dest: KVDest | None,
        generated: int,
        pull: bool = False,
    ) -> None:
        rid = half.req.rid
        report = self._drain_report
        t0 = time.time()
        t1 = t2 = t0
        try:
            activate = Activate(rid=rid)
            if (dest is not None or pull) and self._moves_kv:
                region = await self.engine.export_decode(rid, generated)  # type: ignore[attr-defined]
                t1 = t2 = time.time()
                if pull:
                    session = getattr(self.transfer, "session")  # noqa: B009 - a PullTransfer
                    activate = Activate(rid=rid, kv_session=session, kv_addr=region.addr,
                                        kv_nbytes=region.nbytes)  # fmt: skip
                else:
                    assert dest is not None
                    await self.transfer.send(region.addr, dest, region.nbytes)
                    t2 = time.time()
                self.metrics.kv_sent.labels(self.cfg.worker_id).inc(region.nbytes)
                report.kv_bytes += region.nbytes
            else:
                await self.transfer.send(None, None, nbytes)
                t1 = t2 = time.time()
            await self.peers.post(target, "/v1/internal/activate", activate)
            t3 = time.time()
            report.export_s += t1 - t0
            report.send_s += t2 - t1
            report.activate_s += t3 - t2
            report.max_move_s = max(report.max_move_s, round(t3 - t0, 4))
            report.last_activated_s = round(t3 - self._drain_started, 4)
            report.moved += 1
            report.pulled = report.pulled or pull
            self._push(half, DecodeEvent(event="migrated", url=target, n=half.fed))
            log.info(
                "request %d migrated to %s after %d tokens (export %.1f ms, send %.1f ms, "
                "activate %.1f ms%s)", rid, target, half.fed, 1e3 * (t1 - t0), 1e3 * (t2 - t1),
                1e3 * (t3 - t2), ", pulled" if pull else "",
            )  # fmt: skip
        except Exception as exc:
            report.failed += 1
            log.warning("request %d failed: migration to %s failed: %s", rid, target, exc)
            self._push(half, DecodeEvent(event="error", detail=f"migration failed: {exc}"))
            await self._abort_peer(target, rid, "migration failed")
        finally:
            half.closed = True
            half.events.put_nowait(None)
            self.engine.release(rid)
            self._moving -= 1
            if not self._moving and self.worker.state is not RoleState.DRAIN:
                log.info("drain migrate, moves done: %s", report.model_dump_json())
            self.wake()

    async def _abort_peer(self, url: str, rid: int, reason: str) -> None:
        try:
            await self.peers.post(url, "/v1/internal/abort", Abort(rid=rid, reason=reason))
        except PeerError as exc:
            log.info("abort of %d on %s not delivered: %s", rid, url, exc)
