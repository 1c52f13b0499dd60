// The body shared by every isa_<isa>.cpp: defines rwkv::cpu::RWKV_ISA::fill_kernel_table, which
// points every KernelTable entry at the kernels instantiated with the Vec policy RWKV_VEC.
// Include it once, last, from an isa_<isa>.cpp that has defined RWKV_ISA and RWKV_VEC and
// included its Vec policy (after its target pragma).
#pragma once

#include "cpu/kernel_table.h"
#include "cpu/kernels/convert.h"
#include "cpu/kernels/linear.h"
#include "cpu/kernels/linear_rows.h"
#include "cpu/kernels/ln_mix.h"
#include "cpu/kernels/maa_mix.h"
#include "cpu/kernels/mm8.h"
#include "cpu/kernels/wkv4.h"
#include "cpu/kernels/wkv56.h"
#include "cpu/kernels/wkv7.h"

#ifndef RWKV_VEC
#error "define RWKV_VEC (the Vec policy) before including isa_table.h"
#endif

namespace rwkv {
namespace cpu {
namespace RWKV_ISA {

void fill_kernel_table(KernelTable* table) {
  using V = RWKV_VEC;
  table->wkv4 = &wkv4<V>;
  table->wkv56 = &wkv56<V>;
  table->wkv6_block = &wkv6_block<V>;
  table->wkv7 = &wkv7<V>;
  table->wkv7_block = &wkv7_block<V>;
  table->layer_norm = &layer_norm_rows<V>;
  table->shift_mix = &shift_mix_rows<V>;
  table->maa_mix_f32 = &maa_mix<V, float>;
  table->maa_mix_bf16 = &maa_mix<V, uint16_t>;
  table->maa_half_sums_f32 = &maa_half_sums<V, float>;
  table->maa_half_sums_bf16 = &maa_half_sums<V, uint16_t>;
  table->maa_finish = &maa_finish<V>;
  table->mm8 = &mm8<V>;
  table->mm8_prepare = &mm8_prepare<V>;
  table->mm8_quantize_i16 = &mm8_quantize_i16<V>;
  table->mm8_i16 = &mm8_i16<V>;
  table->mm8_i16_rows = &mm8_i16_rows<V>;
  table->mm8_tile_f32 = &mm8_tile_f32<V>;
  table->mm8_tile_bf16 = &mm8_tile_bf16<V>;
  table->bf16_round = &bf16_round<V>;
  table->linear_one_bf16 = &linear_one<V, uint16_t>;
  table->linear_one_f32 = &linear_one<V, float>;
  table->linear_rows_bf16 = &linear_rows<V, uint16_t>;
  table->linear_rows_f32 = &linear_rows<V, float>;
  if constexpr (HasBf16Rows<V>::value) {
    table->linear_rows_bf16x = &linear_rows_bf16x<V>;
  } else {
    table->linear_rows_bf16x = nullptr;
  }
  if constexpr (HasBf16Dot<V>::value) {
    table->linear_one_bf16x = &linear_one_bf16x<V>;
  } else {
    table->linear_one_bf16x = nullptr;
  }
}

}  // namespace RWKV_ISA
}  // namespace cpu
}  // namespace rwkv
