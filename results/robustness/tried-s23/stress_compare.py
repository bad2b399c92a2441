"""Stress draws against the committed ones: per draw, the mean FluidPD - static, cells below
static - 1 pp, the worst cell and quick-reversal cells, base and new, and the cells that moved.

    python stress_compare.py DIR            (DIR holds seedN.jsonl, N = 1-18, from stress.py)
    python stress_compare.py DIR BASEDIR    (against BASEDIR's seedN.jsonl, any N in both)

(The worst cell and the quick-reversal cells were added in session 27; the outputs made before
print the means and the cells below static - 1 pp only.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent / "stress"


def rows(path: Path) -> dict[int, dict[str, object]]:
    return {r["i"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def main() -> None:
    if not 2 <= len(sys.argv) <= 3:
        sys.exit("usage: python stress_compare.py DIR [BASEDIR]")
    new_dir = Path(sys.argv[1])
    base_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    below, worst, quick, total = [0, 0], [0.0, 0.0], [0, 0], [0.0, 0.0]
    moved_all, up, down, cells = 0, 0, 0, 0
    for n in range(1, 100):
        new = new_dir / f"seed{n}.jsonl"
        if base_dir is not None:
            base = base_dir / f"seed{n}.jsonl"
        elif n <= 18:
            base = BASE / (f"seed{n}-c18e9b8.jsonl" if n <= 16 else f"seed{n}-de14eeb.jsonl")
        else:
            continue
        if not new.exists() or not base.exists():
            continue
        b, w = rows(base), rows(new)
        b = {i: r for i, r in b.items() if i in w}
        parts = []
        for k, (side, d) in enumerate((("base", b), ("new", w))):
            pp = [float(r["vs_static_pp"]) for r in d.values()]  # type: ignore[arg-type]
            qr = sum(bool(r.get("quick_reversals")) for r in d.values())
            below[k] += sum(x < -1 for x in pp)
            worst[k], quick[k], total[k] = min(worst[k], *pp), quick[k] + qr, total[k] + sum(pp)
            parts.append(
                f"{side} mean {sum(pp) / len(pp):+.2f} below {sum(x < -1 for x in pp)}"
                f" worst {min(pp):+.1f} quick-reversal cells {qr}"
            )
        moved = [(i, b[i]["vs_static_pp"], w[i]["vs_static_pp"]) for i in w if i in b
                 and abs(float(b[i]["vs_static_pp"]) - float(w[i]["vs_static_pp"])) > 0.05]  # type: ignore[arg-type]  # fmt: skip
        moved_all += len(moved)
        up += sum(float(x) < float(y) for _, x, y in moved)  # type: ignore[arg-type]
        down += sum(float(x) > float(y) for _, x, y in moved)  # type: ignore[arg-type]
        cells += len(w)
        print(f"draw {n}: {len(w)} cells; {'; '.join(parts)}; moved {moved}")
    if cells == 0:
        sys.exit(f"no seedN.jsonl in {new_dir} with a base to compare it with")
    print(f"{cells} cells, mean {total[0] / cells:+.2f} -> {total[1] / cells:+.2f} pp, "
          f"below static - 1 pp {below[0]} -> {below[1]}, worst {worst[0]:+.1f} -> "
          f"{worst[1]:+.1f}, quick-reversal cells {quick[0]} -> {quick[1]}, moved {moved_all} "
          f"({up} up, {down} down)")  # fmt: skip


if __name__ == "__main__":
    main()
