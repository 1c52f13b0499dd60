// One row of CPU kernels per instruction set: plain function pointers filled in by
// kernels/isa_<isa>.cpp (ATen's DispatchStub idea without its macros). Torch-free.
// Every kernel works on a half-open range of independent units ([c0, c1) channels, [h0, h1)
// heads or [m0, m1) output columns) so the glue can split work with at::parallel_for.
#pragma once

#include <cstdint>

namespace rwkv {
namespace cpu {

// linear_one's columns of at most this many bytes are short (kernels/linear.h): summed W at a time
// from the range's first column, W = the ISA's register width, by another order than longer
// columns. A short column's bits thus depend on where the range begins: callers that split the
// columns start every range at a multiple of 16 (or compute them in one range).
constexpr int64_t kShortColumnBytes = 1024;

struct KernelTable {
  // wkv4_forward on channels [c0, c1): k, v, y [T, C]; w, u, aa, bb, pp [C].
  void (*wkv4)(int64_t T, int64_t C, int64_t c0, int64_t c1, const float* w, const float* u,
               const float* k, const float* v, float* aa, float* bb, float* pp, float* y);
  // wkv5_forward / wkv6_forward on heads [h0, h1): state [H, N, N] (key, value); r, k, v, y
  // [T, H*N]; u [H*N]; w [H*N] advanced by w_step floats per token (0 for wkv5, H*N for wkv6).
  void (*wkv56)(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
                const float* r, const float* k, const float* v, const float* w, int64_t w_step,
                const float* u, float* y);
  // wkv6_block on heads [h0, h1): wkv6 plus the time mix around it (kernels/wkv56.h); r, k, v,
  // w (the decay's low-rank term), g, y [T, H*N]; p [4, H*N] holds the decay base, u, lx_w,
  // lx_b; scratch N floats per head of the range. The old state is read from state_in when it
  // is not null (state is then only written).
  void (*wkv6_block)(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
                     const float* state_in, const float* r, const float* k, const float* v, const float* w,
                     const float* g, const float* p, float eps, float* scratch, float* y);
  // wkv7_forward on heads [h0, h1): state [H, N, N] (value, key); r, w, k, v, a, b, y [T, H*N].
  void (*wkv7)(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
               const float* r, const float* w, const float* k, const float* v, const float* a,
               const float* b, float* y);
  // wkv7_block on heads [h0, h1): wkv7 plus the time mix around it (kernels/wkv7.h); r, w, k,
  // v, a, g, y and, when v_first is not null, v_first and v_gate [T, H*N]; p [8, H*N] holds
  // w0, a0, v0, k_k, k_a, r_k, lx_w, lx_b; scratch 6*N floats per head of the range. The old
  // state is read from state_in when it is not null (state is then only written).
  void (*wkv7_block)(int64_t T, int64_t H, int64_t N, int64_t h0, int64_t h1, float* state,
                     const float* state_in, const float* r, const float* w, const float* k, const float* v,
                     const float* a, const float* g, const float* v_first, const float* v_gate,
                     const float* p, float eps, float* scratch, float* y);
  // ln_mix (kernels/ln_mix.h) in two steps over rows [t0, t1): the layer norm y = LN(x) of
  // x, y [T, C] with w, b [C]; then, once every row is normalised, the n mixes of xx (= y) with
  // its previous row (sx [C] before row 0), out[i] [T, C] at outs[i] from mix [n, C], lerp or
  // delta form.
  void (*layer_norm)(int64_t C, int64_t t0, int64_t t1, const float* x, const float* w,
                     const float* b, float eps, float* y);
  void (*shift_mix)(int64_t T, int64_t C, int64_t n, int64_t t0, int64_t t1, const float* xx,
                    const float* sx, const float* mix, bool lerp, float* const* outs);
  // maa_mix (kernels/maa_mix.h) on channels [c0, c1): out[i] [T, C] at outs[i] from xx [T, C], sx [C],
  // zt [T, n*D] (tanh applied), w2 [n, D, C] (fp32, or bf16 as uint16_t) and maa [n, C].
  void (*maa_mix_f32)(int64_t T, int64_t C, int64_t n, int64_t D, int64_t c0, int64_t c1,
                      const float* xx, const float* sx, const float* zt, const float* w2,
                      const float* maa, float* const* outs);
  void (*maa_mix_bf16)(int64_t T, int64_t C, int64_t n, int64_t D, int64_t c0, int64_t c1,
                       const float* xx, const float* sx, const float* zt, const uint16_t* w2,
                       const float* maa, float* const* outs);
  // maa_mix of one token in two steps: the half-mix sums acc [2n, C] of half-mixes [u0, u1)
  // (w2 read row after row), then out[i] [C] at outs[i] on channels [c0, c1) from xx, sx [C]
  // and maa.
  void (*maa_half_sums_f32)(int64_t C, int64_t D, int64_t u0, int64_t u1, const float* zt,
                            const float* w2, float* acc);
  void (*maa_half_sums_bf16)(int64_t C, int64_t D, int64_t u0, int64_t u1, const float* zt,
                             const uint16_t* w2, float* acc);
  void (*maa_finish)(int64_t C, int64_t n, int64_t c0, int64_t c1, const float* xx,
                     const float* sx, const float* acc, const float* maa, float* const* outs);
  // mm8 on output columns [m0, m1): q holds column m at q + m*N (column-major [N, M] uint8),
  // xs [T, N] = x*ry, sums [T, 3] = (0.5*sum(xs), sum(x*my), sum(x)); rx, mx [M];
  // y[t, m] = rx[m]*(xs[t] . q[:, m] + sums[t,0]) + sums[t,1] + mx[m]*sums[t,2], y row stride M.
  void (*mm8)(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* xs,
              const uint8_t* q, const float* sums, const float* rx, const float* mx, float* y);
  // mm8_seq's tiles: columns [m0, m1) of q as rows of out [m1 - m0, N]: fp32, or bf16 of q - 128.
  void (*mm8_tile_f32)(int64_t N, int64_t m0, int64_t m1, const uint8_t* q, float* out);
  void (*mm8_tile_bf16)(int64_t N, int64_t m0, int64_t m1, const uint8_t* q, uint16_t* out);
  // d[i] = y[i] rounded to bf16 for i < n, as torch rounds (kernels/convert.h).
  void (*bf16_round)(int64_t n, const float* y, uint16_t* d);
  // linear_one on output columns [m0, m1): y[m] = x . w[:, m], column m (bf16 or fp32) at
  // w + m*N; x [N] fp32; columns read one by one (sequential) or 4 at a time (read_sequential()).
  void (*linear_one_bf16)(int64_t N, int64_t m0, int64_t m1, const float* x, const uint16_t* w,
                          float* y, bool sequential);
  void (*linear_one_f32)(int64_t N, int64_t m0, int64_t m1, const float* x, const float* w,
                         float* y, bool sequential);
  // linear_one with bf16 weights and the activation x [N] in bf16 as well (not widened), on
  // ISAs with bf16 dot products (avx512bf16); nullptr elsewhere.
  void (*linear_one_bf16x)(int64_t N, int64_t m0, int64_t m1, const uint16_t* x,
                           const uint16_t* w, float* y, bool sequential);
  // linear_rows on output columns [m0, m1) of y [T, M]: y[t, m] (=, or += with accumulate)
  // x[t] . w[:, m], column m (bf16 or fp32) at w + m*N, row t of x (fp32) at x + t*ldx
  // (kernels/linear_rows.h).
  void (*linear_rows_bf16)(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* x,
                           int64_t ldx, const uint16_t* w, float* y, bool accumulate);
  void (*linear_rows_f32)(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1, const float* x,
                          int64_t ldx, const float* w, float* y, bool accumulate);
  // linear_rows with bf16 weights and the rows of x in bf16 as well (not widened), on ISAs with
  // bf16 dot products (avx512bf16); nullptr elsewhere.
  void (*linear_rows_bf16x)(int64_t T, int64_t N, int64_t M, int64_t m0, int64_t m1,
                            const uint16_t* x, int64_t ldx, const uint16_t* w, float* y,
                            bool accumulate);
  // mm8's preparation for rows [t0, t1): x, ry, my -> xs and sums as above (x [T, N] fp32).
  void (*mm8_prepare)(int64_t N, int64_t t0, int64_t t1, const float* x, const float* ry,
                      const float* my, float* xs, float* sums);
  // mm8_one_i16's steps (one row): xs [N] -> xq [n_pad] int16 (n_pad a multiple of 64, zeros
  // past N; in this row's own layout: pair the two entries of one row), returning the scale
  // (0: use mm8 instead); then on output columns [m0, m1)
  // y[m] = rx[m]*(scale*(xq . q[:, m]) + sums[0]) + sums[1] + mx[m]*sums[2], the dot exact,
  // reading q column by column (sequential) or as 4 streams (see read_sequential()).
  float (*mm8_quantize_i16)(int64_t N, int64_t n_pad, const float* xs, int16_t* xq);
  // mm8_i16 of T rows (mm8_rows_i16) on output columns [m0, m1) of y [T, M]: row t's xq at
  // xq + t*n_pad, its scale scale[t] and sums at sums + 3t; each row's y the bits mm8_i16 gives.
  void (*mm8_i16_rows)(int64_t T, int64_t N, int64_t n_pad, int64_t M, int64_t m0, int64_t m1,
                       const int16_t* xq, const uint8_t* q, const float* scale, const float* sums,
                       const float* rx, const float* mx, float* y);
  void (*mm8_i16)(int64_t N, int64_t m0, int64_t m1, const int16_t* xq, const uint8_t* q,
                  float scale, const float* sums, const float* rx, const float* mx, float* y,
                  bool sequential);
};

// Each fills every entry of its row; defined in kernels/isa_<isa>.cpp.
namespace scalar { void fill_kernel_table(KernelTable* table); }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RWKV_HAVE_X86_ISAS 1
namespace avx2 { void fill_kernel_table(KernelTable* table); }
namespace avx512 { void fill_kernel_table(KernelTable* table); }
namespace avx512vnni { void fill_kernel_table(KernelTable* table); }
namespace avx512bf16 { void fill_kernel_table(KernelTable* table); }
#endif

}  // namespace cpu
}  // namespace rwkv
