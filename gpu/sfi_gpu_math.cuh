/* Device port of ref/sfi_math.c (sfi_expf, sfi_logf, sfi_powf_pos): the
 * same range reduction, coefficients and order of operations. Every float
 * operation is an explicit round-to-nearest intrinsic (__fadd_rn,
 * __fmul_rn, ...), which nvcc never contracts into an FMA, so the results
 * are bit-identical to the host's -ffp-contract=off build (the checker's
 * --bit-exact mode relies on it). sqrt: IEEE sqrt is correctly rounded on
 * both sides (__fsqrt_rn), as the reference's integer sqrt is. At the end,
 * the argmax key the single-GPU and tensor-parallel argmax share. */
#ifndef SFI_GPU_MATH_CUH
#define SFI_GPU_MATH_CUH

#include <stdint.h>

__device__ __forceinline__ float sfi_dev_u2f(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ float sfi_dev_scale2(float y, int k) {
    if (k > 127) {
        y = __fmul_rn(y, sfi_dev_u2f(0x7f000000u));
        k -= 127;
        if (k > 127) k = 127;
    } else if (k < -126) {
        y = __fmul_rn(y, sfi_dev_u2f(0x0c800000u));
        k += 102;
        if (k < -126) k = -126;
    }
    return __fmul_rn(y, sfi_dev_u2f((uint32_t)(0x7f + k) << 23));
}

__device__ __forceinline__ float sfi_dev_expf(float x) {
    const float ln2hi = 6.9314575195e-1f, ln2lo = 1.4286067653e-6f, invln2 = 1.4426950216e+0f;
    const float P1 = 1.6666625440e-1f, P2 = -2.7667332906e-3f;
    uint32_t hx = __float_as_uint(x);
    const int sign = (int)(hx >> 31);
    hx &= 0x7fffffffu;
    if (hx > 0x7f800000u) return __fadd_rn(x, x);
    if (hx >= 0x42aeac50u) {
        if (!sign && hx >= 0x42b17218u) return sfi_dev_u2f(0x7f800000u);
        if (sign && hx >= 0x42cff1b5u) return 0.0f;
    }
    float hi, lo;
    int k;
    if (hx > 0x3eb17218u) {
        if (hx > 0x3f851592u)
            k = __float2int_rz(__fadd_rn(__fmul_rn(invln2, x), sign ? -0.5f : 0.5f));
        else
            k = sign ? -1 : 1;
        hi = __fsub_rn(x, __fmul_rn(__int2float_rn(k), ln2hi));
        lo = __fmul_rn(__int2float_rn(k), ln2lo);
        x = __fsub_rn(hi, lo);
    } else if (hx > 0x39000000u) {
        k = 0;
        hi = x;
        lo = 0.0f;
    } else {
        return __fadd_rn(1.0f, x);
    }
    const float xx = __fmul_rn(x, x);
    const float c = __fsub_rn(x, __fmul_rn(xx, __fadd_rn(P1, __fmul_rn(xx, P2))));
    const float y = __fadd_rn(
        1.0f, __fadd_rn(__fsub_rn(__fdiv_rn(__fmul_rn(x, c), __fsub_rn(2.0f, c)), lo), hi));
    if (k == 0) return y;
    return sfi_dev_scale2(y, k);
}

__device__ __forceinline__ float sfi_dev_logf(float x) {
    const float ln2_hi = 6.9313812256e-01f, ln2_lo = 9.0580006145e-06f;
    const float Lg1 = 0.66666662693f, Lg2 = 0.40000972152f, Lg3 = 0.28498786688f,
                Lg4 = 0.24279078841f;
    uint32_t ix = __float_as_uint(x);
    int k = 0;
    if (ix < 0x00800000u || (ix >> 31)) {
        if ((ix << 1) == 0) return -sfi_dev_u2f(0x7f800000u);
        if (ix >> 31) return (ix << 1) > 0xff000000u ? __fadd_rn(x, x) : sfi_dev_u2f(0x7fc00000u);
        k -= 25;
        x = __fmul_rn(x, sfi_dev_u2f(0x4c000000u));
        ix = __float_as_uint(x);
    } else if (ix >= 0x7f800000u) {
        return __fadd_rn(x, x);
    } else if (ix == 0x3f800000u) {
        return 0.0f;
    }
    ix += 0x3f800000u - 0x3f3504f3u;
    k += (int)(ix >> 23) - 0x7f;
    ix = (ix & 0x007fffffu) + 0x3f3504f3u;
    x = __uint_as_float(ix);
    const float f = __fsub_rn(x, 1.0f);
    const float s = __fdiv_rn(f, __fadd_rn(2.0f, f));
    const float z = __fmul_rn(s, s);
    const float w = __fmul_rn(z, z);
    const float t1 = __fmul_rn(w, __fadd_rn(Lg2, __fmul_rn(w, Lg4)));
    const float t2 = __fmul_rn(z, __fadd_rn(Lg1, __fmul_rn(w, Lg3)));
    const float R = __fadd_rn(t2, t1);
    const float hfsq = __fmul_rn(__fmul_rn(0.5f, f), f);
    const float dk = __int2float_rn(k);
    return __fadd_rn(
        __fadd_rn(__fsub_rn(__fadd_rn(__fmul_rn(s, __fadd_rn(hfsq, R)), __fmul_rn(dk, ln2_lo)),
                            hfsq),
                  f),
        __fmul_rn(dk, ln2_hi));
}

__device__ __forceinline__ float sfi_dev_powf_pos(float x, float y) {
    if (y == 1.0f) return x;
    if (x == 0.0f) return y > 0.0f ? 0.0f : sfi_dev_u2f(0x7f800000u);
    if (y == 0.0f) return 1.0f;
    if (y == 2.0f) return __fmul_rn(x, x);
    if (y == 0.5f) return __fsqrt_rn(x);
    if (y == -1.0f) return __fdiv_rn(1.0f, x);
    return sfi_dev_expf(__fmul_rn(y, sfi_dev_logf(x)));
}


/* ---- argmax keys (sfi_gpu_argmax; sfi_gpu_argmax_keys under --tp) ----
 * A logit and its vocabulary id as one 64-bit key: the float's bits mapped
 * to an order-preserving uint32 (-0 and +0 equal) above ~id, so the
 * largest key is the largest value and, among equal values, the smaller
 * id (the reference's first maximum). A max over keys then gives the same
 * answer in any order, which lets blocks and ranks fold theirs with a
 * 64-bit atomicMax or a plain max. Both argmax forms build their keys here
 * so that a token picked across tensor-parallel ranks is the one picked on
 * one GPU. */
__device__ __forceinline__ unsigned long long sfi_dev_argmax_key(float x, int id) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)o << 32) | (uint32_t)~(uint32_t)id;
}

/* The block's largest key of x[i] (id id0 + i) over its share of a loop
 * strided by the grid's x dimension, folded into *slot by a 64-bit
 * atomicMax. Every thread of the block calls it; blockDim.x is a multiple
 * of 32, at most 1024. */
__device__ __forceinline__ void sfi_dev_argmax_fold(const float *__restrict__ x, int n, int id0,
                                                    unsigned long long *slot) {
    __shared__ unsigned long long sb[32];
    unsigned long long best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned long long k = sfi_dev_argmax_key(x[i], id0 + i);
        best = k > best ? k : best;
    }
    for (int off = 16; off > 0; off >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) sb[w] = best;
    __syncthreads();
    if (w == 0) {
        best = lane < nw ? sb[lane] : 0;
        for (int off = 16; off > 0; off >>= 1) {
            const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
            best = o > best ? o : best;
        }
        if (lane == 0) atomicMax(slot, best);
    }
}

/* The q/k head norm and RoPE in a warp that holds one head of D = 32 J
 * values, lane l owning elements l + 32 j: v is normed in place (RMSNorm
 * with weight nw and eps; the sum of squares over the warp by a fixed xor
 * tree), then rotated with the position's rows cs, sn [D / 2] into o
 * (x[i] = a cos - b sin, x[i + D/2] = b cos + a sin). sfi_gpu_qkv_post's
 * warp form and the attention that makes its own q (sfi_gpu_attn_fuse)
 * both call this, so they give the same bits. */
template <int J>
__device__ __forceinline__ void sfi_dev_warp_norm_rope(float (&v)[J], const float *nw, float eps,
                                                       const float *cs, const float *sn,
                                                       float (&o)[J]) {
    const int lane = threadIdx.x & 31;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < J; j++) ss += v[j] * v[j];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float r = rsqrtf(ss / (float)(32 * J) + eps);
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = __fmul_rn(nw[lane + 32 * j], __fmul_rn(v[j], r));
#pragma unroll
    for (int j = 0; j < J / 2; j++) {
        const int k = lane + 32 * j;
        const float c = cs[k], sn_k = sn[k];
        const float x0 = v[j], x1 = v[j + J / 2];
        o[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn_k));
        o[j + J / 2] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn_k));
    }
}

#endif
