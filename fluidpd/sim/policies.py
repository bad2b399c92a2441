"""The serving policies the simulator compares (paper §V-A baselines and ablations)."""

from __future__ import annotations

from dataclasses import dataclass

POLICY_NAMES = ("static", "fluidtoken", "fluidrole", "fluidpd", "oracle", "autoscale")


class PolicyError(ValueError):
    """Unknown or malformed policy selection."""


@dataclass(frozen=True, slots=True)
class Mechanisms:
    """Which FluidPD mechanisms a simulated run enables."""

    fluidtoken: bool = False
    fluidrole: bool = False
    autoscale: bool = False


MECHANISMS: dict[str, Mechanisms] = {
    "static": Mechanisms(),
    "fluidtoken": Mechanisms(fluidtoken=True),
    "fluidrole": Mechanisms(fluidrole=True),
    "fluidpd": Mechanisms(fluidtoken=True, fluidrole=True),
    "autoscale": Mechanisms(autoscale=True),
}


def parse_policies(text: str) -> list[str]:
    """``all``, one name, or a comma-separated list; order kept, duplicates dropped."""
    names = (
        list(POLICY_NAMES)
        if text.strip() == "all"
        else [t.strip() for t in text.split(",") if t.strip()]
    )
    if not names:
        raise PolicyError("--policy: empty")
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad:
        raise PolicyError(
            f"--policy: unknown policy {bad[0]!r} (choose from {', '.join(POLICY_NAMES)} or all)"
        )
    return list(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """A Dynamo-like planner: scale out a pressured phase after detection + provisioning.

    Defaults are the paper's measurement for Dynamo (§III-C): about 5 s to decide and about
    200 s until the new worker serves (pod scheduling, runtime start, weight load, CUDA graphs).
    """

    detection_s: float = 5.0
    provisioning_s: float = 200.0
    max_workers: int = 10
    #: Decode is "pressured" when average KV commitment exceeds this.
    dpi_adm_scale: float = 0.9


def parse_pd(text: str) -> tuple[int, int]:
    """``4P4D`` -> (4, 4)."""
    t = text.strip().upper()
    try:
        p_text, rest = t.split("P", 1)
        d_text = rest.removesuffix("D")
        if not rest.endswith("D"):
            raise ValueError
        p, d = int(p_text), int(d_text)
    except ValueError:
        raise PolicyError(f"--pd: expected a split like 4P4D, got {text!r}") from None
    if p < 1 or d < 1:
        raise PolicyError(f"--pd: each role needs at least one worker, got {text!r}")
    return p, d
