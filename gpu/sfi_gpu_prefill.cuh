/* Causal prefill attention on tensor cores (included by sfi_gpu_model.cu).
 *
 * Flash-attention-2 forward for a chunk of T queries of one request over
 * the paged bf16 cache: a CTA of 4 warps takes 64 queries of one query
 * head (16 per warp), walks the key tiles of 64 positions up to its last
 * query (double-buffered cp.async copies into padded shared rows), and per
 * tile computes S = Q K^T and O += P V with mma.sync m16n8k16 (bf16 in,
 * f32 accumulate), K and V fragments through ldmatrix (V transposed), the
 * online softmax in base 2 kept per row in registers. Rows of shared
 * memory are D + 8 elements long, so the 8 rows an ldmatrix phase reads
 * fall in different banks. Prefill is compute-bound: K/V are read once
 * per query head (not per GQA group), which costs bandwidth the tensor
 * cores do not wait for at these sizes. */

namespace {

constexpr int kPfQ = 64;     /* queries per CTA */
constexpr int kPfK = 64;     /* keys per tile */
constexpr int kPfThreads = 128;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* 16 bytes global -> shared; src_bytes 0 writes zeros (rows past the end). */
__device__ __forceinline__ void cp16(void *dst, const void *src, int src_bytes) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float pf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int D>
__global__ void __launch_bounds__(kPfThreads)
prefill_attn_kernel(const float *__restrict__ q, int T, int pos0, int row, int nh, int nkv,
                    const int32_t *__restrict__ bt, int max_blocks, int page,
                    const __nv_bfloat16 *__restrict__ kp, const __nv_bfloat16 *__restrict__ vp,
                    float *__restrict__ out) {
    constexpr int LD = D + 8;           /* padded shared row, elements */
    constexpr int KS = D / 16;          /* k-steps of Q K^T */
    constexpr int NT = D / 8;           /* n-tiles of O */
    extern __shared__ __align__(16) unsigned char pf_smem[];
    __nv_bfloat16 *sK = reinterpret_cast<__nv_bfloat16 *>(pf_smem); /* [2][kPfK][LD] */
    __nv_bfloat16 *sV = sK + 2 * kPfK * LD;
    const int h = blockIdx.y, G = nh / nkv, kvh = h / G;
    const int q0 = blockIdx.x * kPfQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int last_q = min(q0 + kPfQ, T) - 1;
    const int n_keys = pos0 + last_q + 1;
    const int n_tiles = (n_keys + kPfK - 1) / kPfK;
    const int32_t *btr = bt + (size_t)row * max_blocks;

    auto load_tile = [&](int tile, int buf) {
        constexpr int CH = D / 8; /* 16-byte chunks per row */
        for (int c = threadIdx.x; c < kPfK * CH; c += kPfThreads) {
            const int r = c / CH, ch = c % CH, kpos = tile * kPfK + r;
            const bool ok = kpos < n_keys;
            const int kk = ok ? kpos : 0;
            const size_t off = (((size_t)btr[kk / page] * nkv + kvh) * page + kk % page) * D + ch * 8;
            cp16(sK + ((size_t)buf * kPfK + r) * LD + ch * 8, kp + off, ok ? 16 : 0);
            cp16(sV + ((size_t)buf * kPfK + r) * LD + ch * 8, vp + off, ok ? 16 : 0);
        }
        cp_commit();
    };
    load_tile(0, 0);

    /* this warp's 16 query rows: A fragments of Q (bf16) */
    const int qr0 = q0 + warp * 16;
    uint32_t qa[KS][4];
    {
        const int ra = min(qr0 + g, T - 1), rb = min(qr0 + g + 8, T - 1);
        const float *pa = q + ((size_t)ra * nh + h) * D, *pb = q + ((size_t)rb * nh + h) * D;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int c = ks * 16 + 2 * t4;
            qa[ks][0] = pack_bf16(pa[c], pa[c + 1]);
            qa[ks][1] = pack_bf16(pb[c], pb[c + 1]);
            qa[ks][2] = pack_bf16(pa[c + 8], pa[c + 9]);
            qa[ks][3] = pack_bf16(pb[c + 8], pb[c + 9]);
        }
    }
    const int qpa = pos0 + qr0 + g, qpb = qpa + 8; /* query positions of rows g, g+8 */
    const float sl2 = rsqrtf((float)D) * 1.4426950408889634f;
    float m_a = -1e30f, m_b = -1e30f, l_a = 0.f, l_b = 0.f;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const int warp_last = pos0 + min(qr0 + 15, T - 1);

    for (int tile = 0; tile < n_tiles; tile++) {
        const int buf = tile & 1;
        if (tile + 1 < n_tiles) {
            load_tile(tile + 1, buf ^ 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const int k0 = tile * kPfK;
        if (k0 <= warp_last && qr0 < T) {
            const __nv_bfloat16 *tK = sK + (size_t)buf * kPfK * LD, *tV = sV + (size_t)buf * kPfK * LD;
            float s[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < KS; ks += 2) {
                    uint32_t b[4];
                    ldsm_x4(b, tK + (size_t)(nt * 8 + (lane & 7)) * LD + ks * 16 + (lane >> 3) * 8);
                    mma_bf16(s[nt], qa[ks], b[0], b[1]);
                    if (ks + 1 < KS) mma_bf16(s[nt], qa[ks + 1], b[2], b[3]);
                }
            }
            /* scale, mask, row max */
            float mx_a = m_a, mx_b = m_b;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const int kc = k0 + nt * 8 + 2 * t4;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    s[nt][e] = (kc + e <= qpa) ? s[nt][e] * sl2 : -INFINITY;
                    s[nt][2 + e] = (kc + e <= qpb) ? s[nt][2 + e] * sl2 : -INFINITY;
                    mx_a = fmaxf(mx_a, s[nt][e]);
                    mx_b = fmaxf(mx_b, s[nt][2 + e]);
                }
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
                mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
            }
            const float ca = pf_exp2(m_a - mx_a), cb = pf_exp2(m_b - mx_b);
            m_a = mx_a;
            m_b = mx_b;
            l_a *= ca;
            l_b *= cb;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                o[i][0] *= ca; o[i][1] *= ca; o[i][2] *= cb; o[i][3] *= cb;
            }
            uint32_t pa[4][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const float p0 = pf_exp2(s[nt][0] - m_a), p1 = pf_exp2(s[nt][1] - m_a);
                const float p2 = pf_exp2(s[nt][2] - m_b), p3 = pf_exp2(s[nt][3] - m_b);
                l_a += p0 + p1;
                l_b += p2 + p3;
                const int kk = nt >> 1, hi = nt & 1;
                pa[kk][hi * 2 + 0] = pack_bf16(p0, p1);
                pa[kk][hi * 2 + 1] = pack_bf16(p2, p3);
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    uint32_t b[4];
                    ldsm_x4_t(b, tV + (size_t)(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                     nt * 8 + (lane >> 4) * 8);
                    mma_bf16(o[nt], pa[kk], b[0], b[1]);
                    mma_bf16(o[nt + 1], pa[kk], b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* the buffer is refilled next iteration */
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
    const int ra = qr0 + g, rb = ra + 8;
    const float ia = l_a > 0.f ? 1.f / l_a : 0.f, ib = l_b > 0.f ? 1.f / l_b : 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int c = nt * 8 + 2 * t4;
        if (ra < T) {
            float *p = out + ((size_t)ra * nh + h) * D + c;
            p[0] = o[nt][0] * ia;
            p[1] = o[nt][1] * ia;
        }
        if (rb < T) {
            float *p = out + ((size_t)rb * nh + h) * D + c;
            p[0] = o[nt][2] * ib;
            p[1] = o[nt][3] * ib;
        }
    }
}

template <int D>
cudaError_t launch_prefill(const float *q, int T, int pos0, int row, int nh, int nkv,
                           const int32_t *bt, int max_blocks, int page, const void *kp,
                           const void *vp, float *out, cudaStream_t st) {
    constexpr size_t smem = (size_t)4 * kPfK * (D + 8) * sizeof(__nv_bfloat16);
    static thread_local bool opted = false; /* per device = per thread (--tp) */
    if (!opted) {
        cudaError_t e = cudaFuncSetAttribute(prefill_attn_kernel<D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        opted = true;
    }
    dim3 grid((T + kPfQ - 1) / kPfQ, nh);
    prefill_attn_kernel<D><<<grid, kPfThreads, smem, st>>>(
        q, T, pos0, row, nh, nkv, bt, max_blocks, page, (const __nv_bfloat16 *)kp,
        (const __nv_bfloat16 *)vp, out);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t sfi_gpu_prefill_attn(const float *q, int T, int pos0, int row, int n_heads,
                                            int n_kv, int head_dim, const int32_t *block_table,
                                            int max_blocks, int page, const void *k_pool,
                                            const void *v_pool, int dtype, float *out, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (dtype != SFI_GPU_BF16) return cudaErrorNotSupported;
    if (head_dim == 128)
        return launch_prefill<128>(q, T, pos0, row, n_heads, n_kv, block_table, max_blocks,
                                        page, k_pool, v_pool, out, st);
    if (head_dim == 64)
        return launch_prefill<64>(q, T, pos0, row, n_heads, n_kv, block_table, max_blocks,
                                       page, k_pool, v_pool, out, st);
    return cudaErrorNotSupported;
}
