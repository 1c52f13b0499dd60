// RWKV-4 recurrence (wkv4_forward), per channel c, in upstream's numerically stable form:
//   ww = u + k_t; p = max(pp, ww); y_t = (e^(pp-p)*aa + e^(ww-p)*v_t) / (e^(pp-p)*bb + e^(ww-p))
//   ww = w + pp; p = max(ww, k_t); aa = e^(ww-p)*aa + e^(k_t-p)*v_t; bb = e^(ww-p)*bb + e^(k_t-p); pp = p
// k, v, y: [T, C] fp32 row-major; w, u, aa, bb, pp: [C] fp32. Channels are independent, so a
// register holds V::width neighbouring channels and the state stays in registers over t.
#pragma once

#include <cstdint>

#include "cpu/kernels/vec_scalar.h"

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

// Channels [c, c + V::width).
template <class V>
inline void wkv4_block(int64_t T, int64_t C, int64_t c, const float* w_, const float* u_,
                       const float* k, const float* v, float* aa_, float* bb_, float* pp_,
                       float* y) {
  using R = typename V::reg;
  const R w = V::load(w_ + c), u = V::load(u_ + c);
  R aa = V::load(aa_ + c), bb = V::load(bb_ + c), pp = V::load(pp_ + c);
  for (int64_t t = 0; t < T; ++t) {
    const R kt = V::load(k + t * C + c), vt = V::load(v + t * C + c);
    R ww = V::add(u, kt);
    R p = V::max(pp, ww);
    R e1 = V::exp(V::sub(pp, p)), e2 = V::exp(V::sub(ww, p));
    V::store(y + t * C + c, V::div(V::fma(e1, aa, V::mul(e2, vt)), V::fma(e1, bb, e2)));
    ww = V::add(w, pp);
    p = V::max(ww, kt);
    e1 = V::exp(V::sub(ww, p));
    e2 = V::exp(V::sub(kt, p));
    aa = V::fma(e1, aa, V::mul(e2, vt));
    bb = V::fma(e1, bb, e2);
    pp = p;
  }
  V::store(aa_ + c, aa);
  V::store(bb_ + c, bb);
  V::store(pp_ + c, pp);
}

template <class V>
void wkv4(int64_t T, int64_t C, int64_t c0, int64_t c1, const float* w, const float* u,
          const float* k, const float* v, float* aa, float* bb, float* pp, float* y) {
  int64_t c = c0;
  for (; c + V::width <= c1; c += V::width) wkv4_block<V>(T, C, c, w, u, k, v, aa, bb, pp, y);
  for (; c < c1; ++c) wkv4_block<typename V::Tail>(T, C, c, w, u, k, v, aa, bb, pp, y);
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
