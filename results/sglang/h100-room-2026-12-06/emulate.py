"""A model of run4's timeline, not a measurement: the hook's own room code (``Streams``,
``extend_next``) driven by stand-in requests on a synthetic clock, to see why a room run let
every suffix through. 12 streams of 800 tokens; 8 suffixes of 12,000 tokens arriving every
0.3 s, each extended in 0.446 s (run4's measured extend) and then streaming 64 tokens; a decode
step of 8.5 ms plus DSTOLEN seconds for each stolen stream in the batch (its long context).

    PYTHONPATH=<checkout>:<checkout>/worker-sidecar python emulate.py TPOT_S [DSTOLEN_S]

prints the iterations held, when each extend ended, and how many of the 20 requests met the
target (with the background stream b0's TPOT and each stolen one's, ms).
"""
import sys
from types import SimpleNamespace
from fluidpd_sidecar.sglang import fluidtoken_hook as h
from fluidpd_sidecar.sglang.fluidtoken_hook import Streams, _Split
DEBUG=False
T=float(sys.argv[1]) if len(sys.argv)>1 else 0.0122
STEP=0.0085; DSTOLEN=float(sys.argv[2]) if len(sys.argv)>2 else 0.0006; EXT=0.446; NB=12; NOUT=800; NS=8; SOUT=64; GAP=0.3
class Req:
    def __init__(s, rid, limit, first=0.0):
        s.rid=rid; s.sampling_params=SimpleNamespace(max_new_tokens=limit); s.output_ids=[]; s.time_stats=SimpleNamespace(decode_prebuilt_finish_time=first, prefill_finished_time=0.0); s.done=False; s.first=first
    def finished(s): return s.done
h._streams=Streams()
now=0.0
running=[Req(f"b{i}",NOUT,first=0.001) for i in range(NB)]
for r in running: r.output_ids=[0]
arrivals=[(0.0+GAP*k, k) for k in range(NS)]
waiting=[]; ext_log=[]; held=0
last=None  # 'decode' | split | None
while running or waiting or arrivals:
    while arrivals and arrivals[0][0]<=now:
        _,k=arrivals.pop(0); r=Req(f"s{k}",SOUT); setattr(r,h._PENDING,_Split(12000,EXT,T,now)); waiting.append(r)
    extended = last if isinstance(last,_Split) else None
    h._streams.observe(now, last=='decode', extended, idle=last is None)
    ran_extend = extended is not None
    req=None
    if waiting:
        req=h.extend_next(waiting, ran_extend, running, now)
        if req is not None and DEBUG:
            b=[r for r in running if r.rid=='b0']
            if b:
                r=b[0]; print(f'ext at {now:.2f}: room {h._streams.room(now,T,running):.3f} it {h._streams.iteration_s()*1e3:.2f} fast {h._streams.fastest_s()*1e3:.2f} b0 elapsed {now-r.first:.2f} out {len(r.output_ids)} budget {T*799-(now-r.first):.3f} need {(800-len(r.output_ids))*h._streams.iteration_s():.3f}')
    if req is not None:
        waiting.remove(req); sp=getattr(req,h._PENDING); delattr(req,h._PENDING)
        now+=EXT; req.time_stats.prefill_finished_time=now; req.output_ids=[0]; req.first=now; running.append(req); ext_log.append(round(now,2)); last=sp; continue
    if running:
        now+=STEP+DSTOLEN*sum(1 for r in running if r.rid.startswith('s'))
        for r in running: r.output_ids.append(0)
        for r in running:
            if len(r.output_ids)>=r.sampling_params.max_new_tokens: r.done=True; r.end=now
        fin=[r for r in running if r.done]; running=[r for r in running if not r.done]
        for r in fin: ext_log.append(('fin',r.rid,round((r.end-r.first)/(r.sampling_params.max_new_tokens-1)*1e3,2)))
        last='decode'
    else:
        now=min(a[0] for a in arrivals) if arrivals else now+STEP; last=None
print('held', h._stats['held'])
print([x for x in ext_log if not isinstance(x,tuple)]); fins=[x for x in ext_log if isinstance(x,tuple)]; T_ms=T*1e3; print('met', sum(1 for f in fins if f[2]<=T_ms), 'of', len(fins), 'b', [f[2] for f in fins if f[1]=='b0'], 's', [f[2] for f in fins if f[1].startswith('s')])
