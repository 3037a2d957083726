#!/usr/bin/env python3
"""Coverage of the CUDA flash kernels' tile loops (cuda/flash_fwd.cuh, cuda/flash_bwd.cuh).

Replays the loops of the dK/dV and dQ kernels for many T (incl. T not a multiple of a tile),
causal and not, head sizes 64 and 128 and every supported (block_q, block_k): every valid
(query, key) pair must be visited exactly once by each kernel, no tile processed without
masking may hold an invalid pair, and in the low-precision accumulator mode every rounding
flush must contain the pairs of exactly one CPU tile (attention/head_cpu.cpp). The tile
constants and loop bounds are transcribed from the kernels: keep them in sync. Run by ctest
(label cpu) with /usr/bin/python3.
"""
import itertools
def cdiv(a,b): return (a+b-1)//b
def check(T,causal,HD,bq,bk):
    BRI = 64 if HD<=64 else 32; BCK=128; BRQ=128; BCI=64
    valid=lambda q,k: q<T and k<T and (not causal or k<=q)
    # CPU groups: dK/dV of key s: one rounding per CPU query tile r0 (block_q) with >=1 valid t
    # (CPU loops key tiles c0 < key_end=r1 (causal): s<r1 - if no valid t the partial is 0)
    # dQ of row t: one rounding per key tile c0 (block_k), c0<=last
    # ---- dkdv
    seen={}
    groups_k={}
    for by in range(cdiv(T,BCK)):
        k0=by*BCK
        it0 = k0//BRI if causal else 0
        n_it=cdiv(T,BRI)
        cur=[]
        for it in range(it0,n_it):
            q0=it*BRI
            need_mask = q0+BRI>T or k0+BCK>T or (causal and k0+BCK-1>q0)
            for key in range(k0,k0+BCK):
                for q in range(q0,q0+BRI):
                    ok = valid(q,key)
                    if not need_mask: assert ok,(T,causal,key,q)
                    if ok: seen[(q,key)]=seen.get((q,key),0)+1; cur.append((q,key))
            if ((it+1)*BRI)%bq==0 or it+1==n_it:
                for (q,key) in cur: groups_k.setdefault(key,[]).append(q//bq)  # record group id
                # ensure one group per flush contains queries of one CPU tile
                tiles={q//bq for (q,key) in cur}
                assert len(tiles)<=1,(T,causal,HD,bq,tiles)
                cur=[]
        assert not cur
    allp={(q,k) for q in range(T) for k in range(T) if valid(q,k)}
    assert set(seen)==allp and all(v==1 for v in seen.values()),"dkdv coverage"
    # every query k<=q before it0 would be missed: covered by set equality above
    # ---- dq
    seen={}
    for by in range(cdiv(T,BRQ)):
        q0=(cdiv(T,BRQ)-1-by)*BRQ
        kv_end=min(T,q0+BRQ) if causal else T
        n_kv=cdiv(kv_end,BCI)
        cur=[]
        for j in range(n_kv):
            kv0=j*BCI
            need_mask = q0+BRQ>T or kv0+BCI>T or (causal and kv0+BCI-1>q0)
            for q in range(q0,q0+BRQ):
                for k in range(kv0,kv0+BCI):
                    ok=valid(q,k)
                    if not need_mask: assert ok
                    if ok: seen[(q,k)]=seen.get((q,k),0)+1; cur.append((q,k))
            if ((j+1)*BCI)%bk==0 or j+1==n_kv:
                assert len({k//bk for (q,k) in cur})<=1
                cur=[]
    assert set(seen)==allp and all(v==1 for v in seen.values()),"dq coverage"
    # ---- fwd: tiles each row sees = CPU's key tiles (bk-aligned), fully masked ones allowed
    for BR,BC in [(bq,bk)]:
        for by in range(cdiv(T,BR)):
            q0=by*BR
            kv_end=min(T,q0+BR) if causal else T
            for j in range(cdiv(kv_end,BC)):
                kv0=j*BC
                need_mask = kv0+BC>T or (causal and kv0+BC-1>q0)
                for q in range(q0,min(q0+BR,T)):
                    for k in range(kv0,kv0+BC):
                        if not need_mask: assert valid(q,k)
            for q in range(q0,min(q0+BR,T)):
                last=q if causal else T-1
                # keys <= last all within loaded range
                assert last < cdiv(kv_end,BC)*BC and last<kv_end
for T in [1,2,15,16,17,63,64,65,100,127,128,129,200,255,256,257,300,383]:
    for causal in [True,False]:
        for HD in [64,128]:
            for bq,bk in [(64,64),(128,64),(128,128)]:
                check(T,causal,HD,bq,bk)
print("coverage OK")
