"""Stress draws against the committed ones: per draw, the mean FluidPD - static, cells below
static - 1 pp, the worst cell and quick-reversal cells, base and new, and the cells that moved.

    python stress_compare.py DIR    (DIR holds seedN.jsonl, N = 1-18, from stress.py)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent / "stress"


def rows(path: Path) -> dict[int, dict[str, object]]:
    return {r["i"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def main() -> None:
    new_dir = Path(sys.argv[1])
    below, moved_all, up, down, cells = [0, 0], 0, 0, 0, 0
    for n in range(1, 19):
        new = new_dir / f"seed{n}.jsonl"
        if not new.exists():
            continue
        base = BASE / (f"seed{n}-c18e9b8.jsonl" if n <= 16 else f"seed{n}-de14eeb.jsonl")
        b, w = rows(base), rows(new)
        parts = []
        for k, (side, d) in enumerate((("base", b), ("new", w))):
            pp = [float(r["vs_static_pp"]) for r in d.values()]  # type: ignore[arg-type]
            below[k] += sum(x < -1 for x in pp)
            parts.append(f"{side} mean {sum(pp) / len(pp):+.2f} below {sum(x < -1 for x in pp)}")
        moved = [(i, b[i]["vs_static_pp"], w[i]["vs_static_pp"]) for i in w if i in b
                 and abs(float(b[i]["vs_static_pp"]) - float(w[i]["vs_static_pp"])) > 0.05]  # type: ignore[arg-type]  # fmt: skip
        moved_all += len(moved)
        up += sum(float(x) < float(y) for _, x, y in moved)  # type: ignore[arg-type]
        down += sum(float(x) > float(y) for _, x, y in moved)  # type: ignore[arg-type]
        cells += len(w)
        print(f"draw {n}: {len(w)} cells; {'; '.join(parts)}; moved {moved}")
    print(f"{cells} cells, below static - 1 pp {below[0]} -> {below[1]}, moved {moved_all} "
          f"({up} up, {down} down)")  # fmt: skip


if __name__ == "__main__":
    main()
