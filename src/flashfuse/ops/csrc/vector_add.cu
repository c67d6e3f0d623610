// Vector add in CUDA C++: the same kernel as the Triton one in ops/vector_add.py, written by hand.
//
//     out[i] = a[i] + b[i]        for 0 <= i < n
//
// One add per 3 * sizeof(T) bytes moved: the kernel is bound by memory bandwidth, and the only question
// is how close to a plain device-to-device copy it gets. What Triton decides for us, spelled out here:
//
// - 16-byte accesses. A thread loads 16 bytes at once (4 fp32 / int32, 8 fp16 / bf16, 2 fp64) with
//   one LDG.128 instruction instead of 4-8 narrow ones, so a warp moves 512 contiguous bytes per
//   instruction. That needs 16-byte aligned addresses: the host checks a, b and out and takes this
//   path only when all three are aligned; the last n % VEC elements are done by a scalar tail.
//   Misaligned inputs (e.g. a view starting one element into a buffer) take the scalar kernel.
// - A grid-stride loop. The grid is sized to the GPU (one full wave: every SM filled with threads),
//   not to n, and each thread walks the vector in steps of the whole grid. Any n works with one
//   launch, consecutive threads always touch consecutive 16-byte chunks (coalesced), and the indices
//   are 64-bit so vectors beyond 2^31 elements are fine.
// - Integer adds wrap (two's complement), like torch: they are done in unsigned arithmetic, because
//   signed overflow is undefined behaviour in C++.

// Light headers only (not torch/extension.h): the Python bindings are generated into a separate C++
// file by load_inline, so nvcc compiles just these, which keeps the first-use compile short.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace {

// 16 bytes of T, aligned to 16, so that the compiler emits one 128-bit load/store per pack.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ T add(T x, T y) {
  if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(y));
  } else {
    return x + y;  // c10::Half / c10::BFloat16 add in fp32 and round once: the correctly rounded sum
  }
}

template <typename T>
__global__ void vector_add_vec16_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                        T* __restrict__ out, int64_t n) {
  using P = Pack<T>;
  const int64_t n_packs = n / P::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const P* a_p = reinterpret_cast<const P*>(a);
  const P* b_p = reinterpret_cast<const P*>(b);
  P* out_p = reinterpret_cast<P*>(out);
  for (int64_t i = first; i < n_packs; i += stride) {
    const P x = a_p[i];
    const P y = b_p[i];
    P z;
#pragma unroll
    for (int j = 0; j < P::kSize; ++j) z.v[j] = add(x.v[j], y.v[j]);
    out_p[i] = z;
  }
  // Scalar tail: the last n % kSize (< 8) elements.
  for (int64_t i = n_packs * P::kSize + first; i < n; i += stride) out[i] = add(a[i], b[i]);
}

template <typename T>
__global__ void vector_add_scalar_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                         T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = add(a[i], b[i]);
  }
}

// 256 threads per block and 8 blocks per SM = 2048 threads, the most an SM holds (sm_80 .. sm_90):
// one full wave. Each thread has two 16-byte loads in flight, 64 KiB per SM, above the ~35 KiB that
// Little's law asks for (4.8 TB/s * ~1 us latency / 132 SMs) to keep HBM busy.
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

template <typename T>
void launch(const T* a, const T* b, T* out, int64_t n, int sms, cudaStream_t stream) {
  const bool aligned = (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                        reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  const int64_t work = aligned ? n / Pack<T>::kSize : n;  // one pack (or element) per thread per trip
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t{sms} * kBlocksPerSm)));
  if (aligned) {
    vector_add_vec16_kernel<T><<<blocks, kThreads, 0, stream>>>(a, b, out, n);
  } else {
    vector_add_scalar_kernel<T><<<blocks, kThreads, 0, stream>>>(a, b, out, n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// out = a + b, elementwise. a, b, out: CUDA, contiguous, same shape and dtype (the Python wrapper checks).
void vector_add(at::Tensor a, at::Tensor b, at::Tensor out) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && out.is_cuda(), "vector_add: all tensors must be on a CUDA device");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(), "vector_add: tensors must be contiguous");
  TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == out.sizes(), "vector_add: shapes differ");
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.scalar_type() == out.scalar_type(), "vector_add: dtypes differ");
  const int64_t n = a.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(a.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.get_device()));
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kHalf, at::kBFloat16, at::kInt, a.scalar_type(), "vector_add", [&] {
    launch<scalar_t>(a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
                     n, sms, stream);
  });
}
