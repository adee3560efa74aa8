// sm_90 features: programmatic-launch waits, cluster barriers, st.async into
// another block's shared memory and the mbarrier it counts on. Each is a
// no-op (or unreachable) in code built for older targets or for HIP.
#pragma once

#include "../vendors/vendor.h"

namespace gdn {
namespace GDN_KERNEL_NS {

// Keeps the loads issued before it ahead of the ones after: the compiler
// otherwise reorders independent loads, and moved the state's copies in
// front of the small loads issued first (docs/decisions.md#small-loads-first).
// __syncwarp orders the warp's memory accesses, so no load moves across it;
// every lane of the warp reaches it. (AMD: no asynchronous copies to queue
// behind, and no __syncwarp in the HIP headers Debian ships: nothing.)
__device__ __forceinline__ void issue_order_fence() {
#if !defined(GDN_AMD)
  __syncwarp();
#endif
}

// Programmatic dependent launch: wait here until the previous kernel on the
// stream has finished (its writes visible). A no-op when the launch was not
// programmatic, so it needs no flag.
__device__ __forceinline__ void wait_upstream() {
#if !defined(GDN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}


// ---- cluster synchronization (sm_90; reached only when size > 1, which the
// planner allows only with sm_90 code). No barrier of the fused path releases
// memory: a releasing arrive is a full fence that waits for every store the
// thread has in flight, the state's included (docs/decisions.md#fused-groups).
// Ordering of shared data between blocks goes through an mbarrier's
// transaction count.
#if !defined(GDN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GDN_CLUSTERS 1
#endif
// "My earlier reads are done" (their values are already in use, so no later
// write can reach them), and (after outputs_barrier_init's fence) "my mbarrier
// is ready".
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if GDN_CLUSTERS
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if GDN_CLUSTERS
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The outputs' mbarrier (one thread): one arrival expected; the fence makes
// the initialization visible to the cluster before the next cluster barrier
// completes.
__device__ __forceinline__ void outputs_barrier_init(unsigned long long* bar) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(a) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  (void)bar;
#endif
}
// Its one arrival (one thread), expecting `bytes` of st.async transactions.
// Peers' transactions may land before it: the count may go below zero
// meanwhile, and the phase cannot complete before this arrival.
__device__ __forceinline__ void outputs_expect(unsigned long long* bar, unsigned bytes) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(a), "r"(bytes)
      : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}
// value -> *slot in the shared memory of every block of the cluster
// (distributed shared memory), each store counted on that block's mbarrier.
__device__ __forceinline__ void push_to_cluster(float* slot, unsigned long long* bar, int size, float value) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(slot));
  const unsigned m = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  for (int r = 0; r < size; ++r) {
    unsigned ra, rm;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rm) : "r"(m), "r"(r));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(ra),
                 "r"(__float_as_uint(value)), "r"(rm)
                 : "memory");
  }
#else
  (void)bar;
  (void)size;
  *slot = value;
#endif
}
// Until every byte the mbarrier expects has landed (phase 0 complete).
__device__ __forceinline__ void outputs_wait(unsigned long long* bar) {
#if GDN_CLUSTERS
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a)
        : "memory");
  } while (!done);
#else
  (void)bar;
#endif
}

}  // namespace GDN_KERNEL_NS
}  // namespace gdn
