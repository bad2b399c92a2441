"""Can the forecast a D->P switch is taken on tell the switches that will be undone from the
ones that hold? For every D->P switch that leaves one decode worker (``lone_decode_commits.py``'s
rows), and for each of the forecast's readings, the one threshold that refuses the most
switches undone inside the reversal cooldown less the switches never undone it also refuses:

    python lone_decode_separation.py commits0.jsonl commits1.jsonl commits2.jsonl
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tried-s30"))

from jsonl_rows import read_rows

COOLDOWN_S = 300.0
READINGS = ("don", "tail", "gain", "arrivals", "gain_share", "at_rate", "dpi_adm")


def switches(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        rows = read_rows(path, "COMMITS.jsonl")
        if any(not isinstance(r, dict) or "commits" not in r for r in rows):
            sys.exit(f"COMMITS.jsonl: {path} is not lone_decode_commits.py's output")
        for r in rows:
            cs = r["commits"]
            for i, c in enumerate(cs):
                if c["src"] != "decode" or c["undo"] or c["D"] != 2 or "don" not in c:
                    continue
                nxt = cs[i + 1] if i + 1 < len(cs) else None
                undone = nxt is not None and nxt["undo"]
                out.append(
                    c
                    | {
                        "undone": undone,
                        "quick": undone and nxt["t"] - c["t"] < COOLDOWN_S,
                        "gain_share": c["gain"] / max(c["arrivals"], 1e-9),
                        "pp": 100 * (r["fluidpd"] - r["static"]),
                        "cell": r["cell"],
                        "seed": r["seed"],
                    }
                )
    return out


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python lone_decode_separation.py COMMITS.jsonl [COMMITS.jsonl ...]")
    pts = switches(sys.argv[1:])
    undone = sum(p["undone"] for p in pts)
    quick = sum(p["quick"] for p in pts)
    print(
        f"D->P switches leaving one decode worker: {len(pts)}; undone {undone}, "
        f"{quick} of them inside the {COOLDOWN_S:.0f} s reversal cooldown"
    )
    for key in READINGS:
        best: tuple[Any, ...] | None = None
        for th in sorted({p[key] for p in pts}):
            for sense in (">=", "<"):
                refused = [p for p in pts if (p[key] >= th) == (sense == ">=")]
                caught = sum(p["quick"] for p in refused)
                kept = [p for p in refused if not p["undone"]]
                if best is None or caught - len(kept) > best[0]:
                    gained = sum(p["pp"] for p in kept)
                    best = (caught - len(kept), sense, th, caught, len(kept), gained)
        assert best is not None
        score, sense, th, caught, kept_n, gained = best
        if score <= 0:
            print(
                f"  {key}: no threshold avoids more quick undos than it refuses switches that held"
            )
            continue
        print(
            f"  refuse if {key} {sense} {th:.3g}: quick undos avoided {caught} of {quick}; "
            f"switches never undone refused too {kept_n} (their cells' FluidPD - static "
            f"summed {gained:+.1f} pp)"
        )
    print("the quick-undone switches (cell, seed, t, don, tail, gain, arrivals, at_rate):")
    for p in sorted((p for p in pts if p["quick"]), key=lambda p: p["don"]):
        print(
            f"  {' '.join(map(str, p['cell']))} s{p['seed']} t={p['t']} don {p['don']} "
            f"tail {p['tail']} gain {p['gain']} arrivals {p['arrivals']} "
            f"at_rate {p['at_rate']}"
        )


if __name__ == "__main__":
    main()
