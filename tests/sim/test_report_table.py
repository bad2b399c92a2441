"""``fluidpd sim``'s printed tables: each says what its columns are."""

from __future__ import annotations

from typing import Any

from fluidpd.sim.report import format_table


def _run(policy: str) -> dict[str, Any]:
    return {
        "workload": "azure-mixed", "rps": 10.0, "policy": policy, "slo_attainment": 0.9,
        "ttft_attainment": 0.95, "tpot_attainment": 0.97, "failed": 0, "stolen_tokens": 12,
        "role_switches": [{"t": 1.0}],
    }  # fmt: skip


def test_each_table_has_a_title_naming_its_columns() -> None:
    lines = format_table([_run("static"), _run("fluidpd")]).splitlines()
    assert lines[0] == "SLO attainment (%; TTFT and TPOT both met)"
    assert lines[1].split() == ["workload", "rps", "static", "fluidpd"]
    second = lines.index("") + 1
    title, head, row = lines[second : second + 3]
    for meaning in ("role switches", "stolen by decode workers", "TTFT and TPOT attainment (%)",
                    "failed requests"):  # fmt: skip
        assert meaning in title, meaning
    assert head.split() == ["workload", "rps", "policy", "switches", "stolen", "tok", "TTFT",
                            "%", "TPOT", "%", "failed"]  # fmt: skip
    assert row.split() == ["azure-mixed", "10", "fluidpd", "1", "12", "95.0", "97.0", "0"]
