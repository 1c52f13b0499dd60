// gemm_fp16(a, b, fp32_out) on CUDA: c = a @ b with fp16 inputs and fp32 accumulation through
// cuBLAS GemmEx (CUBLAS_COMPUTE_32F), c in fp32 or fp16. Upstream's gemm_fp16_cublas: small fp16
// models overflow without the fp32 output. Row-major and column-major operands (the model's
// weights are column-major views) are passed to cuBLAS without a copy; other strides are copied.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "common/checks.h"

namespace {

// A 2-D operand as cuBLAS sees it: `trans` when its storage is column-major, and its leading
// dimension. Copies it to row-major when neither layout fits.
struct BlasOperand {
  at::Tensor t;
  bool trans;
  int64_t ld;
};

BlasOperand as_blas(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, cols)) return {t, false, t.stride(0)};
  if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, rows)) return {t, true, t.stride(1)};
  const at::Tensor c = t.contiguous();
  return {c, false, std::max<int64_t>(1, cols)};
}

// a [T, K] fp16, b [K, M] fp16, same CUDA device. Returns [T, M], fp32 if fp32_out else fp16.
at::Tensor gemm_fp16_cuda(const at::Tensor& a, const at::Tensor& b, bool fp32_out) {
  const char* op = "gemm_fp16";
  RWKV_CHECK_SAME_DEVICE(op, a, b);
  TORCH_INTERNAL_ASSERT(a.is_cuda());
  RWKV_CHECK_DTYPE(op, a, at::kHalf);
  RWKV_CHECK_DIM(op, a, "[T, K]", 2);
  RWKV_CHECK_DTYPE(op, b, at::kHalf);
  RWKV_CHECK_DIM(op, b, "[K, M]", 2);
  RWKV_CHECK_SHAPE(op, b, "[K, M]", a.size(1), b.size(1));
  const int64_t T = a.size(0), K = a.size(1), M = b.size(1);
  TORCH_CHECK(T <= INT32_MAX && K <= INT32_MAX && M <= INT32_MAX, op,
              ": a and b must have sizes below 2^31 for cuBLAS, got ", a.sizes(), " and ",
              b.sizes());
  const c10::cuda::OptionalCUDAGuard guard(a.device());
  const auto out_opts = a.options().dtype(fp32_out ? at::kFloat : at::kHalf);
  if (T == 0 || M == 0) return at::empty({T, M}, out_opts);
  if (K == 0) return at::zeros({T, M}, out_opts);

  // Row-major c [T, M] is column-major c^T [M, T] = b^T [M, K] · a^T [K, T].
  const BlasOperand A = as_blas(a), B = as_blas(b);
  at::Tensor c = at::empty({T, M}, out_opts);
  const float alpha = 1.f, beta = 0.f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to the current stream
  TORCH_CUDABLAS_CHECK(cublasGemmEx(
      handle, B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, A.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(M), static_cast<int>(T), static_cast<int>(K), &alpha, B.t.data_ptr(),
      CUDA_R_16F, static_cast<int>(B.ld), A.t.data_ptr(), CUDA_R_16F, static_cast<int>(A.ld),
      &beta, c.data_ptr(), fp32_out ? CUDA_R_32F : CUDA_R_16F, static_cast<int>(M),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return c;
}

}  // namespace

TORCH_LIBRARY_IMPL(rwkv, CUDA, m) { m.impl("gemm_fp16", &gemm_fp16_cuda); }
