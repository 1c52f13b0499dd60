// Input checks shared by the CPU and CUDA glue. Every message follows the project format
// "<op>: <argument> <rule>, got <actual>" and matches rwkv/ops/_checks.py word for word, so a
// test matches the same text whichever backend ran. Each macro wraps TORCH_CHECK (never assert).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <vector>

namespace rwkv {

// torch's Python spelling of a dtype ("float32"), which c10::toString does not give ("Float").
inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(t);
  }
}

}  // namespace rwkv

// `op` names the op (a const char* or literal); `x` is the argument, named by its spelling.
// x must have dtype dt.
#define RWKV_CHECK_DTYPE(op, x, dt)                                                       \
  TORCH_CHECK((x).scalar_type() == (dt), op, ": " #x " must be ", ::rwkv::dtype_name(dt), \
              ", got ", ::rwkv::dtype_name((x).scalar_type()))

// x must have x_dtype, the dtype of another argument named in `why`, e.g. " (x's dtype)".
#define RWKV_CHECK_DTYPE_AS(op, x, dt, why)                                                      \
  TORCH_CHECK((x).scalar_type() == (dt), op, ": " #x " must be ", ::rwkv::dtype_name(dt), why, \
              ", got ", ::rwkv::dtype_name((x).scalar_type()))

// x must have `ndim` dimensions; `pattern` names them, e.g. "[T, C]".
#define RWKV_CHECK_DIM(op, x, pattern, ndim) \
  TORCH_CHECK((x).dim() == (ndim), op, ": " #x " must have shape " pattern ", got ", (x).sizes())

// A one-token product's x: [N] or [1, N] (one row; its result keeps the row: [M] or [1, M], so
// the model passes its [1, C] activations without a reshape on either side).
#define RWKV_CHECK_ONE_ROW(op, x)                                                     \
  TORCH_CHECK((x).dim() == 1 || ((x).dim() == 2 && (x).size(0) == 1), op,             \
              ": " #x " must have shape [N] or [1, N] (one token), got ", (x).sizes())

// x must have exactly the shape given by the trailing sizes; `pattern` names them.
#define RWKV_CHECK_SHAPE(op, x, pattern, ...)                                                  \
  do {                                                                                         \
    const int64_t rwkv_expected_[] = {__VA_ARGS__}; /* no heap: runs for every decode call */ \
    TORCH_CHECK((x).sizes() == c10::IntArrayRef(rwkv_expected_),                               \
                op, ": " #x " must have shape " pattern " = ", c10::IntArrayRef(rwkv_expected_), \
                ", got ", (x).sizes());                                                        \
  } while (0)

#define RWKV_CHECK_CONTIGUOUS(op, x) \
  TORCH_CHECK((x).is_contiguous(), op, ": " #x " must be contiguous, got strides ", (x).strides())

// b must live on a's device.
#define RWKV_CHECK_SAME_DEVICE(op, a, b)                                                    \
  TORCH_CHECK((a).device() == (b).device(), op, ": " #b " must be on the same device as " #a \
              " (", (a).device(), "), got ", (b).device())
