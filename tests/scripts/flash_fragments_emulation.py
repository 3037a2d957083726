#!/usr/bin/env python3
"""Emulation of the tensor-core fragment layouts used by the CUDA flash kernels.

cuda/flash_common.cuh moves tiles between shared memory and registers with ldmatrix (.x4,
plain and .trans) and multiplies them with mma.sync.m16n8k16; which lane holds which matrix
element is fixed by the PTX ISA, and a wrong index there gives wrong results that only a GPU
would show. This script implements those PTX rules lane by lane, runs the kernels' helpers
(lds_a, lds_b_rows, lds_b_cols, gemm_abt, gemm_pv, c_to_a, a_elem; their address formulas
transcribed from flash_common.cuh, so keep the two in sync) on random integer tiles with
NaN in the padding columns, and requires exact equality with numpy's products. Run by
ctest (label cpu) with /usr/bin/python3 and numpy (Debian python3-numpy).
"""
import numpy as np
rng=np.random.default_rng(0)

def ldsm_x4(smem, pitch, addr_of_lane, trans):
    # smem: 2D array [rows][pitch] (element addressing); addr_of_lane(lane)->(r,c) row start
    regs=[[None]*4 for _ in range(32)]
    for i in range(4):
        rows=[addr_of_lane(8*i+k) for k in range(8)]
        M=np.array([[smem[r][c+j] for j in range(8)] for (r,c) in rows])  # 8x8 matrix i
        for lane in range(32):
            g,cc=lane//4,lane%4
            if not trans: regs[lane][i]=(M[g][2*cc],M[g][2*cc+1])
            else: regs[lane][i]=(M[2*cc][g],M[2*cc+1][g])
    return regs

def mma(D,A,B0,B1):
    # D[lane][4], A[lane][4] pairs, B0/B1[lane] pairs. Build full matrices by PTX layout.
    Am=np.zeros((16,16)); Bm=np.zeros((16,8)); Cm=np.zeros((16,8))
    for lane in range(32):
        g,c=lane//4,lane%4
        a=A[lane]
        Am[g][2*c],Am[g][2*c+1]=a[0]; Am[g+8][2*c],Am[g+8][2*c+1]=a[1]
        Am[g][2*c+8],Am[g][2*c+9]=a[2]; Am[g+8][2*c+8],Am[g+8][2*c+9]=a[3]
        Bm[2*c][g],Bm[2*c+1][g]=B0[lane]; Bm[2*c+8][g],Bm[2*c+9][g]=B1[lane]
        d=D[lane]; Cm[g][2*c],Cm[g][2*c+1],Cm[g+8][2*c],Cm[g+8][2*c+1]=d
    R=Am@Bm+Cm
    for lane in range(32):
        g,c=lane//4,lane%4
        D[lane]=[R[g][2*c],R[g][2*c+1],R[g+8][2*c],R[g+8][2*c+1]]

def lds_a(smem,row0,k0):
    return ldsm_x4(smem,None,lambda lane:(row0+(lane&15),k0+((lane>>4)<<3)),False)
def lds_b_rows(smem,n0,k0):
    return ldsm_x4(smem,None,lambda lane:(n0+(lane&7)+((lane>>4)<<3),k0+(((lane>>3)&1)<<3)),False)
def lds_b_cols(smem,k0,n0):
    return ldsm_x4(smem,None,lambda lane:(k0+(lane&7)+(((lane>>3)&1)<<3),n0+((lane>>4)<<3)),True)

def gemm_abt(NB,HD,sa,a_row0,sx,x_row0):
    acc=[[[0.0]*4 for _ in range(32)] for _ in range(NB)]
    for ks in range(HD//16):
        a=lds_a(sa,a_row0,ks*16)
        for nn in range(NB//2):
            b=lds_b_rows(sx,x_row0+nn*16,ks*16)
            mma(acc[2*nn],a,[b[l][0] for l in range(32)],[b[l][1] for l in range(32)])
            mma(acc[2*nn+1],a,[b[l][2] for l in range(32)],[b[l][3] for l in range(32)])
    return acc
def gemm_pv(HD,K,pa,sx,x_row0):
    acc=[[[0.0]*4 for _ in range(32)] for _ in range(HD//8)]
    for kk in range(K//16):
        for nn in range(HD//16):
            b=lds_b_cols(sx,x_row0+kk*16,nn*16)
            A=[pa[l][kk] for l in range(32)]
            mma(acc[2*nn],A,[b[l][0] for l in range(32)],[b[l][1] for l in range(32)])
            mma(acc[2*nn+1],A,[b[l][2] for l in range(32)],[b[l][3] for l in range(32)])
    return acc
def c_to_a(NB,c):  # c[nb][lane][4] -> pa[lane][kk][4 pairs]
    return [[[ (c[2*kk][l][0],c[2*kk][l][1]), (c[2*kk][l][2],c[2*kk][l][3]),
               (c[2*kk+1][l][0],c[2*kk+1][l][1]), (c[2*kk+1][l][2],c[2*kk+1][l][3])]
             for kk in range(NB//2)] for l in range(32)]
def c_full(c,NB):
    M=np.zeros((16,8*NB))
    for nb in range(NB):
        for l in range(32):
            g,cc=l//4,l%4
            M[g][nb*8+2*cc],M[g][nb*8+2*cc+1],M[g+8][nb*8+2*cc],M[g+8][nb*8+2*cc+1]=c[nb][l]
    return M
def a_elem(pa_l,nb,e):
    v=pa_l[nb>>1][((nb&1)<<1)|(e>>1)]
    return v[e&1]

HD=64; P=HD+8
for (NB,rowsA,rowsX,a0,x0) in [(8,64,64,16,0),(4,128,32,48,0),(16,32,128,16,0)]:
    sa=np.zeros((rowsA,P)); sa[:,:HD]=rng.integers(-4,5,(rowsA,HD)); sa[:,HD:]=np.nan
    sx=np.zeros((rowsX,P)); sx[:,:HD]=rng.integers(-4,5,(rowsX,HD)); sx[:,HD:]=np.nan
    S=c_full(gemm_abt(NB,HD,sa,a0,sx,x0),NB)
    ref=sa[a0:a0+16,:HD]@sx[x0:x0+8*NB,:HD].T
    assert np.array_equal(S,ref), "gemm_abt"
    # P V: P = S (16 x 8NB as A), X = rows x0.. of sx2 (8NB x HD)
    c=gemm_abt(NB,HD,sa,a0,sx,x0)
    pa=c_to_a(NB,c)
    # a_elem check
    Mc=c_full(c,NB)
    for l in range(32):
        g,cc=l//4,l%4
        for nb in range(NB):
            for e in range(4):
                assert a_elem(pa[l],nb,e)==Mc[g+8*(e>>1)][nb*8+2*cc+(e&1)]
    sv=np.zeros((8*NB+16,P)); sv[:,:HD]=rng.integers(-4,5,(8*NB+16,HD)); sv[:,HD:]=np.nan
    O=c_full(gemm_pv(HD,8*NB,pa,sv,16),HD//8)
    assert np.array_equal(O,Mc@sv[16:16+8*NB,:HD]),"gemm_pv"
print("fragment layouts OK")
