// Shared-memory barriers (mbarrier, sm_80+ with the parity wait of sm_90), named barriers and
// the per-warpgroup register split (setmaxnreg, sm_90a) for kernels whose warpgroups take
// different roles: a producer fills a ring of shared-memory stages and consumers drain it
// (moe_tiled_ws.cu).
//
// A stage's two barriers: `full` completes a phase when every producer thread has arrived (its
// data written and made visible), `empty` when every consumer warp has arrived (done reading).
// Phases alternate in parity: round r of a ring of S stages (stage index it, r = it / S) waits
// full with parity r & 1 and empty with parity (r & 1) ^ 1, which a fresh barrier (phase 0 in
// progress) already satisfies, so the producer's first round passes at once.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {

// One thread initialises; a __syncthreads() must follow before any other thread uses it.
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
}
// Makes the initialisations visible to the async proxy and the other threads' arrivals.
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive (release at CTA scope: this thread's earlier writes are visible to whoever waits).
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(SmemAddr(bar))
      : "memory");
}

// An arrival that the hardware makes once every cp.async this thread issued before it has
// landed (the barrier's count includes it: .noinc). The thread goes on at once.
__device__ __forceinline__ void MbarArriveOnCopies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(SmemAddr(bar))
               : "memory");
}

// Blocks until the phase of parity `parity` has completed (acquire at CTA scope).
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// A barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (1 .. 15; 0 is
// __syncthreads'), for a subset of the block such as one warpgroup.
__device__ __forceinline__ void NamedBarrierSync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The warpgroup's register budget per thread (a multiple of 8 in 24 .. 256; the kernel needs
// __launch_bounds__(threads, 1) so that its entry budget is known).
template <uint32_t kRegs>
__device__ __forceinline__ void WarpgroupRegsDecrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void WarpgroupRegsIncrease() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace dsv4::cuda
