// Kernel launches and shared-memory declarations, written once for nvcc and for the SIMT
// emulator (tests/simt: the kernel sources compiled as host C++ with ST_SIMT defined).
//
//   launch(kernel, grid, block, dyn_smem, stream, args...)   instead of kernel<<<...>>>(args)
//   ST_SHARED(float, name, [32]);            instead of __shared__ float name[32];
//   ST_SHARED_DYNAMIC(unsigned char, name, 128);
//                   instead of extern __shared__ __align__(128) unsigned char name[];
//
// On the GPU these are exactly the CUDA constructs. Under the emulator, launch() runs the
// kernel's threads as fibers on the CPU and the shared variables live in the emulated
// block's shared memory, bounds- and race-checked (tests/simt/simt.h). The arguments are
// converted to the kernel's parameter types first, as the <<< >>> syntax does.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <tuple>
#include <utility>

#if defined(ST_SIMT)
#include "cuda/launch.cuh"
#include "simt/simt.h"
#define ST_SHARED(type, name, dims)           \
  static const char st_shared_tag_##name = 0; \
  auto& name = ::simt::shared_array<type dims>(&st_shared_tag_##name, #name)
#define ST_SHARED_DYNAMIC(type, name, align) \
  type* const name = static_cast<type*>(::simt::shared_dynamic(align))
#else
#define ST_SHARED(type, name, dims) __shared__ type name dims
#define ST_SHARED_DYNAMIC(type, name, align) \
  extern __shared__ __align__(align)         \
  type name[]
#endif

namespace st::cudak {

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t dyn_smem, cudaStream_t stream,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: wrong number of kernel arguments");
#if defined(ST_SIMT)
  (void)stream;  // one in-order stream: the launch runs to completion here
  std::tuple<std::decay_t<P>...> params(static_cast<P>(std::forward<A>(args))...);
  ::simt::launch(reinterpret_cast<const void*>(kernel), __PRETTY_FUNCTION__, grid, block, dyn_smem,
                 [&] { std::apply(kernel, params); });
#else
  // clang-format off
  kernel<<<grid, block, dyn_smem, stream>>>(static_cast<P>(std::forward<A>(args))...);
  // clang-format on
#endif
}

}  // namespace st::cudak
