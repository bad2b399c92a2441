"""Supervision of one SGLang server process (started through ``launch`` with our hook).

The sidecar owns the process: it builds the command line (model directory, device, memory
fraction, disaggregation role), starts it in its own process group, waits until SGLang answers
``/health`` (or fails fast with the tail of its log when the process exits first or the start
takes too long), notices a crash, restarts it a bounded number of times, and stops the whole
group with the sidecar. What SGLang writes goes to a log file the errors quote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import socket
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

import fluidpd
from fluidpd.procs import die_with_parent

log = logging.getLogger("fluidpd.sidecar.sglang")

#: The directory that holds ``fluidpd_sidecar`` (put on SGLang's ``PYTHONPATH``).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: The ``fluidpd`` package, whose pure core the scheduler hook imports (numpy only).
CORE_PACKAGE = Path(fluidpd.__file__).resolve().parent
CPU_STUBS = Path(__file__).resolve().parent / "cpu_stubs"
#: SGLang's P/D roles; FluidPD's prefill/decode map onto them, "null" is a unified server.
MODES = ("null", "prefill", "decode")


class SglangError(RuntimeError):
    """The SGLang server could not be started or died (one line, with its log's tail)."""


@dataclass(frozen=True, slots=True)
class SglangConfig:
    python: str
    model_dir: Path
    port: int
    hook_port: int
    #: "cpu", "cuda" or "cuda:N" (N goes to CUDA_VISIBLE_DEVICES, SGLang then sees GPU 0).
    device: str = "cuda"
    mem_fraction: float | None = None
    mode: str = "null"
    bootstrap_port: int | None = None
    #: "mooncake" for real P/D transfers; None leaves SGLang's default.
    transfer_backend: str | None = None
    load_format: str | None = None
    #: SGLang's --dtype; None leaves SGLang's auto rule.
    dtype: str | None = None
    context_length: int | None = None
    max_total_tokens: int | None = None
    extra_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    log_path: Path = Path("sglang.log")
    start_timeout_s: float = 900.0
    #: Crashes after a successful start that are restarted before the sidecar gives up.
    max_restarts: int = 2
    env: dict[str, str] = field(default_factory=dict)
    #: FluidRole worker (``roleswitch``): launched as a decode server whatever ``mode`` (the
    #: role it starts in) says, with a bootstrap server of its own, and flipped in place.
    fluidrole: bool = False

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def overlap_schedule(self) -> bool:
        """SGLang runs its overlap scheduler, where FluidToken's suffix extend is not wired in
        (it is on the CPU recipe's and FluidToken's launches: ``--disable-overlap-schedule``)."""
        return not self.cpu and "--disable-overlap-schedule" not in self.extra_args


def server_command(cfg: SglangConfig, nccl_port: int | None = None) -> list[str]:
    """SGLang's own server flags, run through our launcher.

    ``nccl_port`` is torch.distributed's rendezvous port (``--nccl-port``; on CPU too, for
    gloo). Without it SGLang draws one from the kernel's ephemeral range and binds it only
    after spawning its scheduler, seconds later, when an outgoing connection may hold it (seen
    in CI: a restart died with EADDRINUSE); ``SglangServer.start`` draws it with
    ``free_ports`` at every start.
    """
    argv = [cfg.python, "-m", "fluidpd_sidecar.sglang.launch"]
    argv += ["--model-path", str(cfg.model_dir), "--host", cfg.host, "--port", str(cfg.port)]
    if nccl_port is not None and "--nccl-port" not in cfg.extra_args:
        argv += ["--nccl-port", str(nccl_port)]
    # Token ids in, token ids out: the sidecar detokenizes (the model directory's tokenizer),
    # as with every other engine.
    argv += ["--skip-tokenizer-init", "--sampling-backend", "pytorch", "--grammar-backend", "none"]
    argv += ["--enable-metrics"]
    if cfg.cpu:
        # The CPU recipe (shared/notes/sglang-on-h200.md): no kernel package, eager torch.
        argv += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
        # Overlap scheduling records CUDA events (SGLang 0.5.17's early send of a cached
        # prefix on a prefill server crashes on CPU with it); there is nothing to overlap.
        argv += ["--skip-server-warmup", "--disable-overlap-schedule"]
        # An idle scheduler otherwise spins on its sockets, taking a core from every other
        # process on the host, the model's own forward passes included (``idle_wake`` wakes it
        # for FluidPD's commands).
        argv += ["--sleep-on-idle"]
    else:
        # FA3's kernels are trimmed from the carried sglang-kernel wheel (scripts/gpu).
        argv += ["--attention-backend", "triton"]
    if cfg.mem_fraction is not None:
        argv += ["--mem-fraction-static", f"{cfg.mem_fraction:g}"]
    if cfg.max_total_tokens is not None:
        argv += ["--max-total-tokens", str(cfg.max_total_tokens)]
    if cfg.context_length is not None:
        argv += ["--context-length", str(cfg.context_length)]
    if cfg.load_format is not None:
        argv += ["--load-format", cfg.load_format]
    if cfg.dtype is not None:
        argv += ["--dtype", cfg.dtype]
    if cfg.mode != "null":
        # A FluidRole worker starts as the role-neutral superset (roleswitch's docstring).
        argv += ["--disaggregation-mode", "decode" if cfg.fluidrole else cfg.mode]
        if cfg.transfer_backend:
            argv += ["--disaggregation-transfer-backend", cfg.transfer_backend]
        if cfg.bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(cfg.bootstrap_port)]
    argv += list(cfg.extra_args)
    return argv


def core_path(beside: Path) -> Path | None:
    """Where SGLang's interpreter finds ``fluidpd`` (None: beside ``fluidpd_sidecar``).

    Installed from a wheel, ``fluidpd`` sits beside ``fluidpd_sidecar`` and needs nothing.
    From a source checkout it sits at the repository's root, beside ``tests/``, ``e2e/`` and
    ``operator/``, which must not shadow what SGLang imports: then a directory under
    ``beside`` (the server's log directory) that holds only a link to it."""
    if (PACKAGE_ROOT / "fluidpd").resolve() == CORE_PACKAGE:
        return None
    home = beside / "fluidpd-core"
    link = home / "fluidpd"
    if link.resolve() != CORE_PACKAGE:
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / f".fluidpd-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(CORE_PACKAGE, target_is_directory=True)
        os.replace(tmp, link)  # at once: the other sidecars' servers may be reading it
    return home


def server_env(
    cfg: SglangConfig, base: dict[str, str] | None = None, core: Path | None = None
) -> dict[str, str]:
    """SGLang's environment: ``core`` is ``core_path``'s answer."""
    env = dict(os.environ if base is None else base)
    paths = [str(PACKAGE_ROOT)]
    if core is not None:
        paths.append(str(core))
    if cfg.cpu:
        paths.append(str(CPU_STUBS))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["FLUIDPD_SGLANG_HOOK_PORT"] = str(cfg.hook_port)
    env["PYTHONUNBUFFERED"] = "1"
    if cfg.fluidrole:
        env["FLUIDPD_SGLANG_FLUIDROLE"] = "1"
    if cfg.device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = cfg.device.split(":", 1)[1]
    if cfg.transfer_backend == "mooncake":
        # One host, no RDMA NIC needed: Mooncake's TCP transport.
        env.setdefault("MC_FORCE_TCP", "1")
    env.update(cfg.env)
    return env


def exit_status(code: int) -> str:
    """How a process ended, in words (SGLang kills its own process tree with SIGKILL once a
    child has failed, so -9 is common and does not by itself mean the kernel's OOM killer)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"exited with status {code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


def log_tail(path: Path, lines: int = 8, start: int = 0) -> str:
    """The last ``lines`` non-empty lines of the log from byte ``start`` on, joined by " | "."""
    text = _log_lines(path, start)
    if text is None:
        return "(no log)"
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def _log_lines(path: Path, start: int) -> list[str] | None:
    try:
        with path.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return None


#: A Python exception line as a traceback ends (``ValueError: ...``,
#: ``safetensors._safetensors_rust.SafetensorError: ...``, ``torch.OutOfMemoryError: ...``).
_EXCEPTION = re.compile(r"^(?:\[[^\]]*\]\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)):\s*(.+)$")
#: SGLang's own way of saying "the scheduler failed" after the real error (not the cause).
_WRAPPERS = ("Initialization failed", "Rank 0 scheduler is dead")


def start_failure(path: Path, start: int = 0, limit: int = 400) -> str:
    """Why SGLang died, in one line: the last exception a traceback in its log (from byte
    ``start``, i.e. this start's part) ended with, else the log's last lines, and the log's
    path to read the rest. SGLang prints the scheduler's traceback and then only that a child
    failed; the exception line is what a user needs (a bad model directory, memory)."""
    lines = _log_lines(path, start)
    if lines is None:
        return f"(no log at {path})"
    cause = None
    for line in lines:
        m = _EXCEPTION.match(line.strip())
        if m and not any(w in m.group(2) for w in _WRAPPERS):
            cause = f"{m.group(1)}: {m.group(2).strip()}"
    if cause is None:
        cause = " | ".join(line.strip() for line in lines[-3:] if line.strip()) or "(empty log)"
    if len(cause) > limit:
        cause = cause[: limit - 3] + "..."
    return f"{cause} (log: {path})"


class SglangServer:
    """One SGLang server process: ``start`` (waits for health), ``watch``, ``stop``."""

    def __init__(self, cfg: SglangConfig) -> None:
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.restarts = 0
        #: Seconds the last start took until SGLang answered /health.
        self.start_s = 0.0
        #: Set when the server is gone for good (the sidecar reports NotReady with it).
        self.failed: str | None = None
        self.healthy = False
        self._stopping = False
        self._log_start = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        cfg = self.cfg
        cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = cfg.log_path.open("ab")
        # The log is appended to across restarts: errors quote this start's part only.
        log_start = self._log_start = logf.tell()
        t0 = time.monotonic()
        # Fresh at every start: a restart must not reuse a port its crashed run may hold.
        nccl_port = free_ports(1, cfg.host, avoid={cfg.port, cfg.hook_port, cfg.bootstrap_port})[0]
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *server_command(cfg, nccl_port),
                env=server_env(cfg, core=core_path(cfg.log_path.parent)),
                stdout=logf,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # its scheduler/detokenizer children go with it
                # A SIGKILLed sidecar must not leave SGLang holding the GPU: SGLang gets the
                # SIGTERM a pod stop would give, and its launcher then ends its own children.
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        except OSError as exc:
            raise SglangError(f"cannot run SGLang's python {cfg.python}: {exc}") from None
        finally:
            logf.close()
        self.starts += 1
        self.healthy = False
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as client:
            while True:
                if self.proc.returncode is not None:
                    raise SglangError(
                        f"SGLang {exit_status(self.proc.returncode)} while starting: "
                        f"{start_failure(cfg.log_path, log_start)}"
                    )
                if time.monotonic() - t0 > cfg.start_timeout_s:
                    await self._kill()
                    raise SglangError(
                        f"SGLang did not become healthy within {cfg.start_timeout_s:.0f} s: "
                        f"{start_failure(cfg.log_path, log_start)}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with client.get(f"{cfg.url}/health") as r:
                        if r.status == 200:
                            break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), 1.0)
        self.start_s = time.monotonic() - t0
        self.healthy = True
        log.info("SGLang (pid %d) healthy after %.1f s", self.proc.pid, self.start_s)

    async def watch(self) -> None:
        """Restart a crashed server (up to ``max_restarts``), then report it failed."""
        while not self._stopping:
            assert self.proc is not None
            code = await self.proc.wait()
            self.healthy = False
            if self._stopping:
                return
            reason = f"SGLang (pid {self.proc.pid}) {exit_status(code)}: "
            reason += start_failure(self.cfg.log_path, self._log_start)
            if self.restarts >= self.cfg.max_restarts:
                self.failed = reason
                log.error("%s; giving up after %d restarts", reason, self.restarts)
                return
            self.restarts += 1
            log.warning("%s; restart %d", reason, self.restarts)
            try:
                await self.start()
            except SglangError as exc:
                self.failed = str(exc)
                log.error("restart failed: %s", exc)
                return

    async def _kill(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), wait)
                return

    async def stop(self) -> None:
        self._stopping = True
        self.healthy = False
        await self._kill()


#: Where explicitly chosen listening ports start (below the kernel's ephemeral range).
LISTEN_PORT_FLOOR = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bound(host: str, port: int) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    return s


def free_ports(
    n: int, host: str = "127.0.0.1", avoid: Collection[int | None] = ()
) -> Sequence[int]:
    """``n`` distinct ports free right now (SGLang and its hook listen on them).

    They are drawn below the kernel's ephemeral range where there is one: SGLang's scheduler
    binds the hook's port only after loading the model, seconds later, and a port of the
    ephemeral range can meanwhile go to any outgoing connection (seen in CI: the hook's bind
    failed with EADDRINUSE and SGLang died starting). Without that range, the kernel picks.
    ``avoid``: ports already promised to the same server, free now but bound later.
    """
    rng = random.Random()
    top = _ephemeral_start()
    socks: list[socket.socket] = []
    held: list[socket.socket] = []
    try:
        for _ in range(100 * n if top > LISTEN_PORT_FLOOR + n else 0):
            if len(socks) == n:
                break
            port = rng.randrange(LISTEN_PORT_FLOOR, top)
            s = None if port in avoid else _bound(host, port)
            if s is not None:
                socks.append(s)
        while len(socks) < n:
            s = _bound(host, 0)
            if s is None:
                raise OSError(f"no free port on {host}")
            # Held (not closed) while drawing, so the kernel cannot hand it out again.
            (held if s.getsockname()[1] in avoid else socks).append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks + held:
            s.close()
