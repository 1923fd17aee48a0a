/* Two-stream slow step (sfi(7) GPU PATH). Host-side orchestration only:
 * it enqueues kernels and events, never blocks and never allocates.
 *
 * Timeline with overlap (R = SFI_GPU_RING ring slots, slot = i mod R):
 *   main: [wait free[slot]] Attn_i -> logits[slot]   [record attn[slot]]
 *   side: [wait attn[slot]] Sel_i(logits[slot], sel_ws[slot]) Reorg_i
 *         [record free[slot]]
 *   after the last layer: side records done, main waits done (the single
 *   barrier before the next fast step).
 * Attn_{i+R} reuses slot i's logits only after Sel_i has consumed them
 * (free[slot]); Sel_i never starts before Attn_i wrote its logits. The side
 * stream has the lowest priority, so the block scheduler prefers the main
 * stream's attention CTAs and Selector work fills the gaps. */
#include <cuda_runtime.h>
#include "sfi_gpu.h"

extern "C" cudaError_t sfi_gpu_slow_step(const sfi_gpu_slow_plan *pl, const sfi_gpu_step_desc *h,
                                         const sfi_gpu_step_desc *d, int dtype,
                                         const sfi_gpu_sel_params *prm, int overlap) {
    cudaError_t e;
    /* overlapped: the attention grid at 2 waves unless the caller chose
     * (measured on the H100: one CTA per pair and SM lets Selector CTAs
     * push a pair onto a shared SM for the whole layer) */
    sfi_gpu_attn_ws aws = pl->attn_ws;
    if (overlap && aws.waves == 0) aws.waves = 2;
    for (int i = 0; i < pl->n_layers; i++) {
        const int slot = i % SFI_GPU_RING;
        cudaStream_t side = overlap ? pl->side_st : pl->main_st;
        if (overlap && (e = cudaStreamWaitEvent(pl->main_st, pl->ev_free[slot], 0)))
            return e;
        e = sfi_gpu_attn_dense(h, d, dtype, pl->q, pl->k_pool[i], pl->v_pool[i], pl->out,
                               pl->logits[slot], &aws, 0, pl->main_st);
        if (e) return e;
        if (overlap) {
            if ((e = cudaEventRecord(pl->ev_attn[slot], pl->main_st))) return e;
            if ((e = cudaStreamWaitEvent(side, pl->ev_attn[slot], 0))) return e;
        }
        e = sfi_gpu_selector(h, d, prm, pl->logits[slot], pl->key_norms[i], &pl->sel_ws[slot],
                             nullptr, pl->selected[i], 0, side);
        if (e) return e;
        e = sfi_gpu_reorg(h, d, dtype, pl->k_pool[i], pl->v_pool[i], pl->selected[i], pl->ck[i],
                          pl->cv[i], nullptr, side);
        if (e) return e;
        if (overlap && (e = cudaEventRecord(pl->ev_free[slot], side))) return e;
    }
    if (overlap) {
        if ((e = cudaEventRecord(pl->ev_done, pl->side_st))) return e;
        if ((e = cudaStreamWaitEvent(pl->main_st, pl->ev_done, 0))) return e;
    }
    return cudaSuccess;
}
