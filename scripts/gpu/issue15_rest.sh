#!/bin/bash
# Issue #15's two H200 measurements still missing, in ONE device call (~6-7 min expected: the
# drain part took 130-173 s in its earlier runs, the live part 159 s; ask `status` first: a
# machine is started only with >= 4 min of device time left). The call sends the session's main
# checkout, so the tree to run travels as an ignored folder (28 MB with main's 21 MB < 64 MiB):
#   bash scripts/gpu/prepare.sh                    # here, in the worktree: .whl/ and .gpudata/
#   M=/work/main; echo /.gpb15/ >> $M/.git/info/exclude; rm -rf $M/.gpb15; mkdir $M/.gpb15
#   git archive HEAD | tar -x -C $M/.gpb15 && cp -r .whl .gpudata $M/.gpb15/
#   git log -1 --format='%H %s' > $M/.gpb15/TREE   # the archived commit, copied to $OUT
#   rm $M/.gpb15/.whl/mooncake*                     # 46 MB, only for --kv-transfer mooncake
# then `run` with carry [".gpb15"], timeout_s 600, command:
#   cd .gpb15 && bash scripts/gpu/issue15_rest.sh
# (git there sees main's checkout, so $OUT/commit.txt names main's HEAD; $OUT/tree.txt, from
# TREE, names the tree that ran.)
# 1. drain15.sh drain with --idle-target (32 active 2K-context requests, 8B, cuda-ipc then shm)
# 2. drain15.sh live (results/gpu/live-8b-shared's 2P2D, static vs FluidPD, cuda-ipc + migrate)
# The device returns at most 8 files, <= 2 folders deep: each part is packed into one .tgz as
# soon as it ends (so a call cut short keeps the finished part), with the live runs' full
# sidecar, router and controller logs (paper_scale.sh keeps only their tails in logs.txt).
# CPU dry run of part 1 only (tiny engine, shm):
#   NO_SETUP=1 PARTS=drain TRANSPORTS=shm OUT=/tmp/r15 ENGINE="--engine-model tiny-llama \
#     --device cpu --dtype float32" PROFILE=results/drills/tiny-gpu-profile.yaml SHM_MIB=16 \
#     SIZE="--idle-target --active 8 --prompt-len 512 --max-tokens 128 --model serving-path" \
#     bash scripts/gpu/issue15_rest.sh
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export NO_SETUP=1
O=$OUT
mkdir -p "$O"
git log -1 --format='%H %s' > "$O/commit.txt" 2>/dev/null || true
cp TREE "$O/tree.txt" 2>/dev/null || true
for PART in ${PARTS:-drain live}; do
  T0=$(date +%s)
  if [ "$PART" = drain ]; then
    OUT=$O/drain SIZE=${SIZE:-"--idle-target --active 32 --prompt-len 2048 --max-tokens 512"} \
      bash scripts/gpu/drain15.sh drain > "$O/drain-run.txt" 2>&1
    RC=$?
  else
    rm -rf /tmp/paper-*
    # Ends by 560 s into the call (the device's limit is 600 s), leaving time to pack.
    LEFT=$((560 - SECONDS))
    OUT=$O/live timeout ${LIVE_TIMEOUT:-$((LEFT < 400 ? LEFT : 400))} bash scripts/gpu/drain15.sh live \
      > "$O/live-run.txt" 2>&1
    RC=$?
    tar czf "$O/live/paper-run-dirs.tgz" /tmp/paper-* 2>/dev/null
  fi
  echo "$PART: rc $RC, wall $(($(date +%s) - T0)) s" | tee -a "$O/walls.txt"
  tar czf "$O/$PART.tgz" -C "$O" "$PART" && rm -rf "${O:?}/$PART"
done
tail -n 8 "$O/drain-run.txt" "$O/live-run.txt" 2>/dev/null
ls -la "$O"
