"""Compares two sets of stress draws cell by cell (files seedN.jsonl in each folder):

    python stress_diff.py BASEDIR NEWDIR

per draw and overall: mean FluidPD - static, cells below static - 1 pp, the worst, cells with a
quick reversal, and the cells that moved by 1 pp or more."""
import json, sys, glob, os
base, new = sys.argv[1], sys.argv[2]
tot = {"b": [], "n": []}
for path in sorted(glob.glob(os.path.join(new, "seed*.jsonl")), key=lambda p: int(os.path.basename(p)[4:-6])):
    s = os.path.basename(path)
    bp = os.path.join(base, s)
    if not os.path.exists(bp):
        continue
    B = {r["i"]: r for r in map(json.loads, open(bp))}
    N = {r["i"]: r for r in map(json.loads, open(path))}
    common = sorted(set(B) & set(N))
    if len(common) < len(B):
        print(s, "incomplete", len(common), "of", len(B))
    for tag, D in (("b", B), ("n", N)):
        tot[tag] += [D[i] for i in common]
    moved = [(N[i]["vs_static_pp"] - B[i]["vs_static_pp"], i) for i in common if abs(N[i]["vs_static_pp"] - B[i]["vs_static_pp"]) >= 1.0]
    def summ(D):
        v = [D[i]["vs_static_pp"] for i in common]
        return f"mean {sum(v)/len(v):+.2f} below-1 {sum(x < -1 for x in v)} worst {min(v):+.1f} qr {sum(D[i]['quick_reversals'] > 0 for i in common)} maxsw {max(D[i]['max_switches_10min'] for i in common)}"
    print(f"{s}: {len(common)} cells | base {summ(B)} | new {summ(N)} | moved {len(moved)}: " + " ".join(f"c{i}:{B[i]['vs_static_pp']:+.1f}->{N[i]['vs_static_pp']:+.1f}" for d, i in sorted(moved)))
for tag in "bn":
    v = [r["vs_static_pp"] for r in tot[tag]]
    if v:
        print(tag, len(v), f"mean {sum(v)/len(v):+.2f} below-1 {sum(x < -1 for x in v)} worst {min(v):+.1f} qr-cells {sum(r['quick_reversals'] > 0 for r in tot[tag])}")
