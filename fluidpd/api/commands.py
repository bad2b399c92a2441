"""The command lines the project's launchers give its processes, as typed values.

``fluidpd up`` starts sidecars and a router as local processes; the operator writes the same
command lines into pod specs. Both build a :class:`SidecarCommand` and a
:class:`RouterCommand`, so each flag is spelled once, here, next to the processes' own parsers
(``fluidpd/cli/sidecar_cmd.py``, which takes its choices from this module, and
``fluidpd/cli/router_cmd.py``). Tests parse ``argv()`` with those parsers, so they cannot drift
apart.

This is an interface of the sidecar process, like its HTTP protocol beside it: the operator
may import it (operator -> core and protocol), and it imports nothing of the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The sidecar's engines (``--engine``).
ENGINES = ("sim", "gpu", "sglang")
#: KV hand-off transports (``--kv-transfer``).
TRANSFERS = ("sim", "mooncake", "shm", "cuda-ipc")
#: ``--sglang-prefill-window``: requests FluidToken's planner has in an SGLang prefill server at
#: once (one computing, the others' KV in transfer; SGLang's Mooncake transfers overlap).
SGLANG_PREFILL_WINDOW = 4


@dataclass(frozen=True, slots=True)
class ModelRef:
    """How a sidecar or a router finds its model: a profile file, or the shipped profile of a
    model x GPU; and optionally the model directory it serves."""

    model: str = "llama-3.1-8b"
    gpu: str = "a100-80gb"
    #: A profile file; when set, ``model``/``gpu`` are not passed.
    profile: str | None = None
    model_dir: str | None = None

    def argv(self) -> list[str]:
        args = (
            ["--profile", self.profile]
            if self.profile
            else ["--model", self.model, "--gpu", self.gpu]
        )
        if self.model_dir is not None:
            args += ["--model-dir", self.model_dir]
        return args


@dataclass(frozen=True, slots=True)
class GpuEngineArgs:
    """The ``gpu`` engine's options (``--engine gpu``)."""

    engine_model: str
    device: str
    dtype: str
    weight_seed: int


@dataclass(frozen=True, slots=True)
class SimEngineArgs:
    """The ``sim`` engine's timing options; ``None`` leaves the sidecar's default."""

    noise: float | None = None
    drift: float | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class SidecarCommand:
    """One ``fluidpd sidecar`` command line. Values are strings where a launcher passes a
    placeholder the container runtime expands (``$(POD_NAME)``)."""

    worker_id: str
    role: str
    host: str
    port: int
    model: ModelRef
    ttft_slo: float
    tpot_slo: float
    eta: float
    token_dpi_load_high: float
    token_split_budget: bool = False
    url: str | None = None
    engine: str = "sim"
    kv_transfer: str = "sim"
    kv_arena_mib: int | None = None
    fluidtoken: bool = True
    adaptive: bool = False
    force_steal: float | None = None
    sim: SimEngineArgs = SimEngineArgs()
    gpu: GpuEngineArgs | None = None
    log_level: str | None = None
    #: Passed through last (the CRD's ``engine.args``), so they override what comes before.
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.kv_transfer not in TRANSFERS:
            raise ValueError(f"kv_transfer must be one of {', '.join(TRANSFERS)}")
        # Without them the sidecar's defaults apply (the operator passes the user's engine.args).
        if self.gpu is not None and self.engine != "gpu":
            raise ValueError("gpu engine options go with engine 'gpu' only")

    def argv(self) -> list[str]:
        """The arguments after ``fluidpd sidecar``."""
        args = ["--id", self.worker_id, "--role", self.role, "--host", self.host,
                "--port", str(self.port)]  # fmt: skip
        if self.url is not None:
            args += ["--url", self.url]
        args += ["--engine", self.engine, "--kv-transfer", self.kv_transfer]
        if self.kv_arena_mib is not None:
            args += ["--kv-arena-mib", str(self.kv_arena_mib)]
        args += ["--ttft-slo", str(self.ttft_slo), "--tpot-slo", str(self.tpot_slo)]
        args += ["--eta", str(self.eta), "--token-dpi-load-high", str(self.token_dpi_load_high)]
        args += self.model.argv()
        optional = (
            ("--noise", self.sim.noise),
            ("--drift", self.sim.drift),
            ("--seed", self.sim.seed),
            ("--force-steal", self.force_steal),
        )
        for flag, value in optional:
            if value is not None:
                args += [flag, str(value)]
        if not self.fluidtoken:
            args.append("--no-fluidtoken")
        if self.token_split_budget:
            args.append("--token-split-budget")
        if self.adaptive:
            args.append("--adaptive")
        if self.gpu is not None:
            g = self.gpu
            args += ["--engine-model", g.engine_model, "--device", g.device, "--dtype", g.dtype,
                     "--weight-seed", str(g.weight_seed)]  # fmt: skip
        if self.log_level is not None:
            args += ["--log-level", self.log_level]
        return [*args, *self.extra]


@dataclass(frozen=True, slots=True)
class RouterCommand:
    """One ``fluidpd router`` command line; ``None`` leaves the router's default."""

    host: str
    port: int
    model: ModelRef
    pairing: str | None = None
    first_token_timeout: float | None = None
    log_level: str | None = None
    #: Static workers, ``ID=URL`` each (a deployment without them discovers its pods).
    workers: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The arguments after ``fluidpd router``."""
        args = ["--host", self.host, "--port", str(self.port), *self.model.argv()]
        optional = (
            ("--pairing", self.pairing),
            ("--first-token-timeout", self.first_token_timeout),
            ("--log-level", self.log_level),
        )
        for flag, value in optional:
            if value is not None:
                args += [flag, str(value)]
        for w in self.workers:
            args += ["--worker", w]
        return args
