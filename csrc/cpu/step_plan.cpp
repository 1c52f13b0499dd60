// The step plan (torch.classes.rwkv.StepPlan): a decode step's program, the layers' own list of
// op calls (rwkv/models/program.py), run without Python between the ops.
//
// Why: while decoding a 1.5b model on CPU, Python and the dispatcher between the ops cost a
// noticeable share of a token: every call builds its list arguments anew (a product group's
// weights and their side tensors, 20-30 tensors), boxes them into IValues, passes our Autograd
// kernel and unboxes them again, each step touching memory that the weights streamed in between
// have evicted from the caches. A plan builds each call's constant arguments once (its weight
// lists stay built) and calls the op's CPU kernel directly, unboxed (the dispatcher's typed
// redispatch to the CPU key: the very function a call from Python ends in, so the results are
// the same bits). Ops without a typed entry here (torch's own: views, copies, activations,
// adds) are called boxed through the dispatcher.
//
// The program comes from Python (Program.encode) as flat integers:
//   [n_inputs, n_slots, n_steps, step..., n_results, ref...]
//   step: [op index, n_args, arg..., n_outs, slot...]
//   arg:  0 ref (a tensor) | 1 n ref... (a tensor list) | 2 v (an int) | 3 n v... (an int list)
//       | 4 i (the float floats[i]) | 5 v (a bool) | 6 (None)
//   ref:  >= 0 a slot (0: x, 1..n_inputs-1: the other inputs, then the steps' results); < 0 the
//         constant consts[-ref - 1]
// A step's slots take its results in order (a Tensor[] result: its elements). Each slot is
// released after the step that uses it last, so the ops' block pool gets memory back within the
// step.
//
// Two more savings, both keeping the op's computation: the product ops run as planned products
// (product_step.h: checks and layout kept from the first call), and where no result of a step
// can be read after the call (none is a result of the program, and only typed steps, rwkv ops
// that never return an input or a view of one, read them), the step writes its results into the
// same tensors every call (its first call's; into.h). A plan runs one call at a time (a lock):
// those steps keep state between calls.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/float_io.h"
#include "cpu/into.h"
#include "cpu/pooled.h"
#include "cpu/product_step.h"

namespace rwkv {
namespace cpu {
namespace {

using Env = std::vector<at::Tensor>;

enum Tag : int64_t { kTensor, kTensorList, kInt, kIntList, kFloat, kBool, kNone, kTags };

// One argument of a step, as the program gives it.
struct Arg {
  int64_t tag = kNone;
  int64_t ref = 0;                 // kTensor
  std::vector<int64_t> refs;       // kTensorList
  bool all_constant = false;       // kTensorList: every element a constant, held in `fixed`
  std::vector<at::Tensor> fixed;   // kTensorList: the constants (the list, when all_constant)
  std::vector<int64_t> ints;       // kIntList
  int64_t i = 0;                   // kInt
  double f = 0.0;                  // kFloat
  bool b = false;                  // kBool
};

struct Step;
using Call = std::function<void(const Step&, const std::vector<at::Tensor>&, Env&)>;

struct Step {
  std::string op;               // its qualified name ("rwkv::ln_mix_split", "aten::to.dtype")
  std::vector<Arg> args;
  std::vector<int64_t> outs;    // the slots of its results
  std::vector<int64_t> release; // slots whose last use is this step
  Call call;
  bool typed = false;           // its kernel called unboxed (typed_call), else boxed
  int64_t weight_bytes = 0;     // the bytes of the distinct constant tensors it reads
};

// A step's arguments during one call: constants, this call's values and, for tensor lists with
// values in them and optional tensors, this call's copies (one per argument position, since
// the arguments of a call are evaluated in any order).
class Args {
 public:
  Args(const Step& s, const std::vector<at::Tensor>& consts, Env& env)
      : s_(s), consts_(consts), env_(env) {}

  const at::Tensor& tensor(size_t k) const { return ref(s_.args[k].ref); }

  at::Tensor& mut_tensor(size_t k) {
    const int64_t r = s_.args[k].ref;
    if (r >= 0) return env_[static_cast<size_t>(r)];
    held_[k] = ref(r);  // a constant (no program writes one): a handle of our own
    return held_[k];
  }

  at::TensorList list(size_t k) {
    const Arg& a = s_.args[k];
    if (a.all_constant) return a.fixed;
    c10::SmallVector<at::Tensor, 8>& v = lists_[k];
    v.clear();
    for (size_t j = 0; j < a.refs.size(); ++j)
      v.push_back(a.refs[j] >= 0 ? env_[static_cast<size_t>(a.refs[j])] : a.fixed[j]);
    return v;
  }

  const std::optional<at::Tensor>& optional(size_t k) {
    std::optional<at::Tensor>& o = opts_[k];
    if (s_.args[k].tag == kNone) {
      o.reset();
    } else {
      o = tensor(k);
    }
    return o;
  }

 private:
  const at::Tensor& ref(int64_t r) const {
    return r >= 0 ? env_[static_cast<size_t>(r)] : consts_[static_cast<size_t>(-r - 1)];
  }

  const Step& s_;
  const std::vector<at::Tensor>& consts_;
  Env& env_;
  static constexpr size_t kMaxArgs = 16;
  std::array<c10::SmallVector<at::Tensor, 8>, kMaxArgs> lists_;
  std::array<std::optional<at::Tensor>, kMaxArgs> opts_;
  std::array<at::Tensor, kMaxArgs> held_;

 public:
  static constexpr size_t max_args() { return kMaxArgs; }
};

// Argument k of a typed call, converted to the kernel's parameter type P.
template <class P>
struct Get;
template <>
struct Get<const at::Tensor&> {
  static const at::Tensor& get(Args& a, const Step&, size_t k) { return a.tensor(k); }
};
template <>
struct Get<at::Tensor&> {
  static at::Tensor& get(Args& a, const Step&, size_t k) { return a.mut_tensor(k); }
};
template <>
struct Get<at::TensorList> {
  static at::TensorList get(Args& a, const Step&, size_t k) { return a.list(k); }
};
template <>
struct Get<const std::optional<at::Tensor>&> {
  static const std::optional<at::Tensor>& get(Args& a, const Step&, size_t k) {
    return a.optional(k);
  }
};
template <>
struct Get<c10::IntArrayRef> {
  static c10::IntArrayRef get(Args&, const Step& s, size_t k) { return s.args[k].ints; }
};
template <>
struct Get<int64_t> {
  static int64_t get(Args&, const Step& s, size_t k) { return s.args[k].i; }
};
template <>
struct Get<double> {
  static double get(Args&, const Step& s, size_t k) { return s.args[k].f; }
};
template <>
struct Get<bool> {
  static bool get(Args&, const Step& s, size_t k) { return s.args[k].b; }
};

// The tags an argument of parameter type P may have.
template <class P>
bool accepts(int64_t tag);
template <>
bool accepts<const at::Tensor&>(int64_t tag) { return tag == kTensor; }
template <>
bool accepts<at::Tensor&>(int64_t tag) { return tag == kTensor; }
template <>
bool accepts<at::TensorList>(int64_t tag) { return tag == kTensorList; }
template <>
bool accepts<const std::optional<at::Tensor>&>(int64_t tag) { return tag == kTensor || tag == kNone; }
template <>
bool accepts<c10::IntArrayRef>(int64_t tag) { return tag == kIntList; }
template <>
bool accepts<int64_t>(int64_t tag) { return tag == kInt; }
template <>
bool accepts<double>(int64_t tag) { return tag == kFloat; }
template <>
bool accepts<bool>(int64_t tag) { return tag == kBool; }

void store(const Step& s, Env& env, at::Tensor&& y) {
  if (!s.outs.empty()) env[static_cast<size_t>(s.outs[0])] = std::move(y);
}

void store(const Step& s, Env& env, std::vector<at::Tensor>&& ys) {
  TORCH_CHECK(ys.size() >= s.outs.size(), "StepPlan: ", s.op, " returned ", ys.size(),
              " tensors where the plan unpacks ", s.outs.size());
  for (size_t j = 0; j < s.outs.size(); ++j) env[static_cast<size_t>(s.outs[j])] = std::move(ys[j]);
}

// A step calling the CPU kernel of op, whose C++ signature is Ret(P...), unboxed.
template <class Sig>
struct Typed;
template <class Ret, class... P>
struct Typed<Ret(P...)> {
  template <size_t... K>
  static Call make(const Step& s, std::index_sequence<K...>) {
    TORCH_CHECK(s.args.size() == sizeof...(P), "StepPlan: ", s.op, " takes ", sizeof...(P),
                " arguments, the program gives ", s.args.size());
    const bool ok[] = {true, accepts<P>(s.args[K].tag)...};
    for (size_t k = 0; k < sizeof...(P); ++k)
      TORCH_CHECK(ok[k + 1], "StepPlan: argument ", k, " of ", s.op,
                  " has the wrong kind in the program");
    const c10::TypedOperatorHandle<Ret(P...)> op =
        c10::Dispatcher::singleton().findSchemaOrThrow(s.op.c_str(), "").typed<Ret(P...)>();
    return [op](const Step& st, const std::vector<at::Tensor>& consts, Env& env) {
      Args a(st, consts, env);
      store(st, env,
            op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                          Get<P>::get(a, st, K)...));
    };
  }
  static Call make(const Step& s) { return make(s, std::index_sequence_for<P...>{}); }
};

using T = const at::Tensor&;
using TM = at::Tensor&;
using TL = at::TensorList;
using IL = c10::IntArrayRef;
using OT = const std::optional<at::Tensor>&;
using Vec = std::vector<at::Tensor>;

// The rwkv ops of the decode programs, with their CPU kernels' C++ signatures (the
// dispatcher checks each against the registered kernel when the plan is built).
Call typed_call(const Step& s) {
  const std::string& n = s.op;
  if (n == "rwkv::ln_mix_split") return Typed<Vec(T, T, T, T, T, bool, double)>::make(s);
  if (n == "rwkv::maa_lora_one") return Typed<Vec(T, T, T, T, T, T)>::make(s);
  if (n == "rwkv::linear_one_chain") return Typed<Vec(TL, TL, TL, IL, IL)>::make(s);
  if (n == "rwkv::linear_one_group") return Typed<Vec(TL, TL, TL, IL)>::make(s);
  if (n == "rwkv::linear_one_ffn") return Typed<at::Tensor(TL, TL, TL, IL, T, int64_t)>::make(s);
  if (n == "rwkv::linear_one_residual")
    return Typed<at::Tensor(T, T, TL, int64_t, T, OT)>::make(s);
  if (n == "rwkv::linear_one_slabs") return Typed<at::Tensor(T, T, TL, int64_t)>::make(s);
  if (n == "rwkv::linear_one") return Typed<at::Tensor(T, T, int64_t)>::make(s);
  if (n == "rwkv::mm8_one_i16") return Typed<at::Tensor(T, T, T, T, T, T, int64_t)>::make(s);
  if (n == "rwkv::pooled_empty_like") return Typed<at::Tensor(T)>::make(s);
  if (n == "rwkv::ln_mix_rows") return Typed<Vec(T, T, T, T, T, bool, double)>::make(s);
  if (n == "rwkv::maa_mix_rows") return Typed<Vec(T, T, T, T, T)>::make(s);
  if (n == "rwkv::linear_rows") return Typed<at::Tensor(T, T)>::make(s);
  if (n == "rwkv::mm8_rows_i16") return Typed<at::Tensor(T, T, T, T, T, T, int64_t)>::make(s);
  if (n == "rwkv::wkv4_block") return Typed<Vec(T, T, T, T, T, T, T, T)>::make(s);
  if (n == "rwkv::wkv6_block") return Typed<at::Tensor(TM, T, T, T, T, T, T, double, OT)>::make(s);
  if (n == "rwkv::wkv7_block")
    return Typed<at::Tensor(TM, T, T, T, T, T, T, OT, OT, T, double, OT)>::make(s);
  return nullptr;
}

// A typed op with an *_into form (into.h): its first call is the typed call; later calls write
// the results that may be reused (reuse[j] for result j) into the first call's result tensors.
template <class Sig>
struct Reusing;
template <class Ret, class... P>
struct Reusing<Ret(P...)> {
  using Fn = Ret (*)(P..., Into);
  // fresh (where given): the results that get a new tensor every call (they outlive the token),
  // made by prepare, which the plan runs at its start, before any weights have gone through the
  // caches (allocating among the layers' products, each allocation ran cold).
  template <size_t... K>
  static Call make(const Step& s, Fn fn, std::vector<bool> reuse, std::vector<bool> fresh,
                   std::function<void()>* prepare, std::index_sequence<K...>) {
    Call first = Typed<Ret(P...)>::make(s);
    auto kept = std::make_shared<std::vector<at::Tensor>>();  // the results' tensors
    // The fresh results' tensors for the next call, and each one's shape and dtype (from the
    // first call; no dtype yet before it).
    struct Fresh {
      std::vector<at::Tensor> next;
      std::vector<std::vector<int64_t>> sizes;
      std::vector<std::optional<at::ScalarType>> dtypes;
    };
    auto made = std::make_shared<Fresh>();
    fresh.resize(reuse.size(), false);  // one flag per result
    bool any_fresh = false;
    for (const bool f : fresh) any_fresh = any_fresh || f;
    if (prepare != nullptr && any_fresh) {
      *prepare = [made, fresh] {
        for (size_t j = 0; j < made->dtypes.size(); ++j) {
          if (fresh[j] && made->dtypes[j].has_value())
            made->next[j] = pooled_empty(made->sizes[j], *made->dtypes[j]);
        }
      };
    }
    return [fn, first, kept, made, reuse, fresh](const Step& st,
                                                 const std::vector<at::Tensor>& consts, Env& env) {
      if (kept->empty()) {
        first(st, consts, env);
        const size_t n = st.outs.size();
        kept->resize(n);
        made->next.resize(n);
        made->sizes.resize(n);
        made->dtypes.resize(n);
        for (size_t j = 0; j < n; ++j) {
          const at::Tensor& t = env[static_cast<size_t>(st.outs[j])];
          if (reuse[j]) (*kept)[j] = t;
          if (fresh[j] && t.is_contiguous()) {
            made->sizes[j] = t.sizes().vec();
            made->dtypes[j] = t.scalar_type();
          }
        }
        return;
      }
      c10::SmallVector<const at::Tensor*, 8> into;
      for (size_t j = 0; j < kept->size(); ++j) {
        const at::Tensor& k = (*kept)[j];
        const at::Tensor& f = made->next[j];
        into.push_back(k.defined() ? &k : f.defined() ? &f : nullptr);
      }
      Args a(st, consts, env);
      store(st, env, fn(Get<P>::get(a, st, K)..., Into(into)));
      for (at::Tensor& f : made->next) f.reset();  // each given out once (the result holds it)
    };
  }
  static Call make(const Step& s, Fn fn, std::vector<bool> reuse,
                   std::vector<bool> fresh = {}, std::function<void()>* prepare = nullptr) {
    return make(s, fn, std::move(reuse), std::move(fresh), prepare,
                std::index_sequence_for<P...>{});
  }
};

// The block and mix ops with an *_into form, reusing the results marked in reuse; nullptr for
// other ops or where nothing is reused. ln_mix_split's new shift state, a result of the program
// (never reused), is then made at the plan's start instead (*prepare, Reusing's fresh).
Call reusing_call(const Step& s, const std::vector<bool>& reuse, std::function<void()>* prepare) {
  bool any = false;
  for (const bool r : reuse) any = any || r;
  if (!any) return nullptr;
  const std::string& n = s.op;
  if (n == "rwkv::ln_mix_split") {
    std::vector<bool> fresh(reuse.size(), false);
    if (fresh.size() > 1) fresh[1] = !reuse[1];
    return Reusing<Vec(T, T, T, T, T, bool, double)>::make(s, &ln_mix_split_into, reuse, fresh,
                                                            prepare);
  }
  if (n == "rwkv::maa_lora_one")
    return Reusing<Vec(T, T, T, T, T, T)>::make(s, &maa_lora_one_into, reuse);
  if (n == "rwkv::wkv6_block")
    return Reusing<at::Tensor(TM, T, T, T, T, T, T, double, OT)>::make(s, &wkv6_block_into, reuse);
  if (n == "rwkv::wkv7_block")
    return Reusing<at::Tensor(TM, T, T, T, T, T, T, OT, OT, T, double, OT)>::make(
        s, &wkv7_block_into, reuse);
  return nullptr;
}

// The group, chain, residual and ffn ops as planned products (product_step.h), where their weight
// and side lists are the plan's constants; nullptr otherwise. reuse: see ProductStep.
Call product_call(const Step& s, bool reuse) {
  // Only product steps have the weight and side arguments read below; other steps (e.g.
  // pooled_empty_like) may have fewer, so the op is checked before any argument is read.
  std::shared_ptr<ProductStep> ps = ProductStep::make(s.op, reuse);
  if (ps == nullptr || s.args.size() < 3) return nullptr;
  const bool residual = s.op == "rwkv::linear_one_residual";
  const bool constant = residual ? s.args[1].ref < 0 && s.args[2].all_constant
                                 : s.args[1].all_constant && s.args[2].all_constant;
  if (!constant) return nullptr;
  const bool chain = s.op == "rwkv::linear_one_chain", ffn = s.op == "rwkv::linear_one_ffn";
  return [ps, residual, chain, ffn](const Step& st, const std::vector<at::Tensor>& consts,
                                    Env& env) {
    Args a(st, consts, env);
    ProductStep::Call c;
    c.side = a.list(2);
    if (residual) {
      c.x = at::TensorList(a.tensor(0));
      c.w = at::TensorList(a.tensor(1));
      c.act = c10::IntArrayRef(st.args[3].i);
      c.residual = &a.tensor(4);
      c.gate = st.args[5].tag == kTensor ? &a.tensor(5) : nullptr;
    } else {
      c.x = a.list(0);
      c.w = a.list(1);
      c.act = st.args[3].ints;
      if (chain) c.src = st.args[4].ints;
      if (ffn) {
        c.residual = &a.tensor(4);
        c.gate_index = st.args[5].i;
      }
    }
    store(st, env, ps->run(c));
  };
}

// A tensor of `sizes` and `strides` at element `offset` of t's memory: an alias, as aten's view
// ops return it (the plan runs without autograd), made without the dispatcher.
at::Tensor alias_of(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides,
                    int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(),
                                                   t.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  return at::Tensor(std::move(impl));
}

// t [1, ...] as t[0] (nothing else holds the head's [1, V] result that this is taken from).
at::Tensor first_row(const at::Tensor& t) {
  return alias_of(t, t.sizes().slice(1), t.strides().slice(1), t.storage_offset());
}

// A bf16 tensor's values in a new pooled fp32 tensor (exact), by float_io.h's loop at any length
// (its widened() hands long tensors to ATen's conversion, the dispatcher this avoids).
at::Tensor widened_bf16(const at::Tensor& t) {
  at::Tensor out = pooled_empty(t.sizes(), at::kFloat);
  fp32_values(t, out.data_ptr<float>());
  return out;
}

// Three aten steps run without the dispatcher where they can be, with the same values: the two a
// one-token program ends with, the head's result [1, V] taken as [V] (aten::select.int) and, for
// bf16 activations, the logits widened to fp32 (aten::to.dtype), and an in-place program's state
// updates (aten::copy_). Each runs right after a product has streamed its weights, which flushes
// the dispatcher's code and tables from the caches, so a trip through it is slow there. Other
// arguments, and other ops, take `boxed`; nullptr: not one of these ops.
Call aten_call(const Step& s, const Call& boxed) {
  const auto tags = [&](std::initializer_list<int64_t> want) {
    if (s.args.size() != want.size()) return false;
    size_t k = 0;
    for (const int64_t tag : want)
      if (s.args[k++].tag != tag) return false;
    return true;
  };
  if (s.op == "aten::select.int" && tags({kTensor, kInt, kInt})) {
    const bool first = s.args[1].i == 0 && (s.args[2].i == 0 || s.args[2].i == -1);
    if (!first) return nullptr;
    return [boxed](const Step& st, const std::vector<at::Tensor>& consts, Env& env) {
      Args a(st, consts, env);
      const at::Tensor& t = a.tensor(0);
      if (t.defined() && t.device().is_cpu() && t.dim() >= 1 && t.size(0) == 1 &&
          !t.requires_grad()) {
        store(st, env, first_row(t));
      } else {
        boxed(st, consts, env);
      }
    };
  }
  // copy_(self, src, non_blocking): an in-place program's state update (the new shift state into
  // the sequence's slot), a memcpy where both are contiguous CPU tensors of one dtype and size.
  if (s.op == "aten::copy_" && tags({kTensor, kTensor, kBool})) {
    return [boxed](const Step& st, const std::vector<at::Tensor>& consts, Env& env) {
      Args a(st, consts, env);
      const at::Tensor& dst = a.tensor(0);
      const at::Tensor& src = a.tensor(1);
      if (dst.defined() && src.defined() && dst.device().is_cpu() && src.device().is_cpu() &&
          dst.scalar_type() == src.scalar_type() && dst.sizes().equals(src.sizes()) &&
          dst.is_contiguous() && src.is_contiguous() && !dst.requires_grad() &&
          !src.requires_grad()) {
        if (dst.data_ptr() != src.data_ptr())
          std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
        store(st, env, at::Tensor(dst));
      } else {
        boxed(st, consts, env);
      }
    };
  }
  // to(self, dtype, non_blocking, copy, memory_format): fp32, no copy asked for, no format.
  if (s.op == "aten::to.dtype" && tags({kTensor, kInt, kBool, kBool, kNone})) {
    if (s.args[1].i != static_cast<int64_t>(at::kFloat) || s.args[3].b) return nullptr;
    return [boxed](const Step& st, const std::vector<at::Tensor>& consts, Env& env) {
      Args a(st, consts, env);
      const at::Tensor& t = a.tensor(0);
      if (t.defined() && t.device().is_cpu() && t.scalar_type() == at::kBFloat16 &&
          t.is_contiguous() && !t.requires_grad()) {
        store(st, env, widened_bf16(t));
      } else {
        boxed(st, consts, env);
      }
    };
  }
  return nullptr;
}

// Any other op: called boxed through the dispatcher (all its keys), as the interpreter calls it.
Call boxed_call(const Step& s) {
  const size_t dot = s.op.find('.', s.op.find("::"));
  const std::string name = s.op.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : s.op.substr(dot + 1);
  const std::optional<c10::OperatorHandle> found =
      c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK_VALUE(found.has_value(), "StepPlan: no op named ", s.op);
  const c10::OperatorHandle op = *found;
  const auto& want = op.schema().arguments();
  TORCH_CHECK(want.size() == s.args.size(), "StepPlan: ", s.op, " takes ", want.size(),
              " arguments, the program gives ", s.args.size());
  const auto& rets = op.schema().returns();
  const bool one_list = rets.size() == 1 && rets[0].type()->kind() == c10::TypeKind::ListType;
  TORCH_CHECK(one_list || s.outs.size() <= rets.size(), "StepPlan: ", s.op, " returns ",
              rets.size(), " values where the plan takes ", s.outs.size());
  return [op, one_list](const Step& st, const std::vector<at::Tensor>& consts, Env& env) {
    Args a(st, consts, env);
    torch::jit::Stack stack;
    stack.reserve(st.args.size());
    for (size_t k = 0; k < st.args.size(); ++k) {
      const Arg& g = st.args[k];
      switch (g.tag) {
        case kTensor: stack.emplace_back(a.tensor(k)); break;
        case kTensorList: stack.emplace_back(a.list(k).vec()); break;
        case kInt: stack.emplace_back(g.i); break;
        case kIntList: stack.emplace_back(g.ints); break;
        case kFloat: stack.emplace_back(g.f); break;
        case kBool: stack.emplace_back(g.b); break;
        default: stack.emplace_back(); break;
      }
    }
    op.callBoxed(&stack);
    if (one_list) {
      store(st, env, stack.at(0).toTensorVector());
    } else {
      for (size_t j = 0; j < st.outs.size(); ++j)
        env[static_cast<size_t>(st.outs[j])] = stack.at(j).toTensor();
    }
  };
}

// The bytes of the distinct constant tensors among a step's arguments (its weights and their
// side tensors, read from memory every token).
int64_t constant_bytes(const Step& s, const std::vector<at::Tensor>& consts) {
  std::vector<std::pair<const void*, int64_t>> seen;
  int64_t total = 0;
  const auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const std::pair<const void*, int64_t> key(t.data_ptr(), static_cast<int64_t>(t.nbytes()));
    for (const auto& k : seen) {
      if (k == key) return;
    }
    seen.push_back(key);
    total += key.second;
  };
  for (const Arg& a : s.args) {
    if (a.tag == kTensor && a.ref < 0) add(consts[static_cast<size_t>(-a.ref - 1)]);
    for (const at::Tensor& t : a.fixed) add(t);
  }
  return total;
}

// Reads the flat program (header comment) with bounds checks.
class Reader {
 public:
  explicit Reader(c10::IntArrayRef code) : code_(code) {}
  int64_t next(const char* what) {
    TORCH_CHECK_VALUE(pos_ < code_.size(), "StepPlan: the program ends early (reading ", what,
                      " at ", pos_, ")");
    return code_[pos_++];
  }
  int64_t count(const char* what, int64_t most) {
    const int64_t n = next(what);
    TORCH_CHECK_VALUE(n >= 0 && n <= most, "StepPlan: ", what, " must be in [0, ", most,
                      "], got ", n);
    return n;
  }
  bool done() const { return pos_ == code_.size(); }
  size_t pos() const { return pos_; }

 private:
  c10::IntArrayRef code_;
  size_t pos_ = 0;
};

class StepPlan : public torch::CustomClassHolder {
 public:
  StepPlan(std::vector<at::Tensor> consts, std::vector<int64_t> code, std::vector<double> floats,
               std::vector<std::string> ops)
      : consts_(std::move(consts)) {
    Reader rd(code);
    n_inputs_ = rd.count("n_inputs", 1 << 20);
    TORCH_CHECK_VALUE(n_inputs_ >= 1, "StepPlan: n_inputs must be at least 1 (x), got 0");
    n_slots_ = rd.count("n_slots", 1 << 24);
    TORCH_CHECK_VALUE(n_slots_ >= n_inputs_, "StepPlan: n_slots (", n_slots_,
                      ") must count the inputs (", n_inputs_, ")");
    const int64_t n_steps = rd.count("n_steps", 1 << 20);
    const auto ref = [&](const char* what) {
      const int64_t r = rd.next(what);
      TORCH_CHECK_VALUE(r < n_slots_ && -r - 1 < static_cast<int64_t>(consts_.size()),
                        "StepPlan: ", what, " ", r, " names no slot (", n_slots_,
                        ") or constant (", consts_.size(), ")");
      return r;
    };
    steps_.resize(static_cast<size_t>(n_steps));
    std::vector<int64_t> last(static_cast<size_t>(n_slots_), -1);  // per slot: its last use
    std::vector<bool> written(static_cast<size_t>(n_slots_), false);
    for (int64_t i = 0; i < n_inputs_; ++i) written[static_cast<size_t>(i)] = true;
    const auto use = [&](int64_t r, int64_t step) {
      if (r < 0) return;
      TORCH_CHECK_VALUE(written[static_cast<size_t>(r)], "StepPlan: step ", step,
                        " reads slot ", r, " before any step writes it");
      last[static_cast<size_t>(r)] = step;
    };
    for (int64_t si = 0; si < n_steps; ++si) {
      Step& s = steps_[static_cast<size_t>(si)];
      const int64_t op = rd.next("op index");
      TORCH_CHECK_VALUE(op >= 0 && op < static_cast<int64_t>(ops.size()), "StepPlan: op index ",
                        op, " out of range [0, ", ops.size(), ")");
      s.op = ops[static_cast<size_t>(op)];
      const int64_t n_args = rd.count("n_args", static_cast<int64_t>(Args::max_args()));
      s.args.resize(static_cast<size_t>(n_args));
      for (Arg& a : s.args) {
        a.tag = rd.next("tag");
        TORCH_CHECK_VALUE(a.tag >= 0 && a.tag < kTags, "StepPlan: unknown argument tag ", a.tag);
        if (a.tag == kTensor) {
          a.ref = ref("tensor ref");
          use(a.ref, si);
        } else if (a.tag == kTensorList) {
          const int64_t n = rd.count("list length", 1 << 16);
          a.all_constant = true;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t r = ref("list element");
            use(r, si);
            a.refs.push_back(r);
            a.all_constant = a.all_constant && r < 0;
            a.fixed.push_back(r < 0 ? consts_[static_cast<size_t>(-r - 1)] : at::Tensor());
          }
        } else if (a.tag == kInt || a.tag == kBool) {
          a.i = rd.next("int");
          a.b = a.i != 0;
        } else if (a.tag == kIntList) {
          const int64_t n = rd.count("int list length", 1 << 16);
          for (int64_t j = 0; j < n; ++j) a.ints.push_back(rd.next("int list element"));
        } else if (a.tag == kFloat) {
          const int64_t k = rd.next("float index");
          TORCH_CHECK_VALUE(k >= 0 && k < static_cast<int64_t>(floats.size()),
                            "StepPlan: float index ", k, " out of range");
          a.f = floats[static_cast<size_t>(k)];
        }
      }
      const int64_t n_outs = rd.count("n_outs", 1 << 16);
      for (int64_t j = 0; j < n_outs; ++j) {
        const int64_t r = rd.next("out slot");
        TORCH_CHECK_VALUE(r >= n_inputs_ && r < n_slots_ && !written[static_cast<size_t>(r)],
                          "StepPlan: step ", si, " writes slot ", r,
                          ", which is an input, out of range or written before");
        written[static_cast<size_t>(r)] = true;
        last[static_cast<size_t>(r)] = si;  // released at once when nothing reads it
        s.outs.push_back(r);
      }
    }
    for (Step& s : steps_) s.weight_bytes = constant_bytes(s, consts_);
    step_ns_.assign(steps_.size(), 0);
    const int64_t n_results = rd.count("n_results", 1 << 20);
    for (int64_t j = 0; j < n_results; ++j) {
      const int64_t r = ref("result ref");
      TORCH_CHECK_VALUE(r < 0 || written[static_cast<size_t>(r)], "StepPlan: result ", j,
                        " is slot ", r, ", which no step writes");
      results_.push_back(r);
      if (r >= 0) last[static_cast<size_t>(r)] = n_steps;  // kept to the end
    }
    TORCH_CHECK_VALUE(rd.done(), "StepPlan: ", code.size() - rd.pos(),
                      " integers after the program's end");
    for (size_t r = 0; r < last.size(); ++r) {
      if (last[r] >= 0 && last[r] < n_steps) steps_[static_cast<size_t>(last[r])].release.push_back(
          static_cast<int64_t>(r));
    }
    for (Step& s : steps_) {
      s.call = typed_call(s);
      s.typed = static_cast<bool>(s.call);
      if (!s.typed) {
        s.call = boxed_call(s);
        if (Call fast = aten_call(s, s.call)) s.call = std::move(fast);
      }
    }
    // Product steps whose results may go into tensors they reuse: no result of the program, and
    // read only by typed steps (rwkv ops, which never return an input or a view of one).
    std::vector<bool> escapes(static_cast<size_t>(n_slots_), false);
    for (const int64_t r : results_) {
      if (r >= 0) escapes[static_cast<size_t>(r)] = true;
    }
    for (const Step& s : steps_) {
      if (s.typed) continue;
      for (const Arg& a : s.args) {
        if (a.tag == kTensor && a.ref >= 0) escapes[static_cast<size_t>(a.ref)] = true;
        for (const int64_t r : a.refs) {
          if (r >= 0) escapes[static_cast<size_t>(r)] = true;
        }
      }
    }
    for (Step& s : steps_) {
      if (!s.typed) continue;
      std::vector<bool> reuse;
      for (const int64_t r : s.outs) reuse.push_back(!escapes[static_cast<size_t>(r)]);
      bool all = true;
      for (const bool r : reuse) all = all && r;
      Call planned = product_call(s, all);
      std::function<void()> prepare;
      if (!planned) planned = reusing_call(s, reuse, &prepare);
      if (planned && prepare) prepare_.push_back(std::move(prepare));
      if (planned) {
        s.call = std::move(planned);
        ++planned_;
      }
    }
  }

  // run() on x = emb[token:token + 1] (emb [V, C] on the CPU), the row taken here as an alias
  // (aten's narrow, called from Python after the last token's head has flushed the dispatcher
  // from the caches, would be a slow dispatcher trip).
  std::vector<at::Tensor> run_row(at::Tensor emb, int64_t token,
                                  std::vector<at::Tensor> state) const {
    TORCH_CHECK_VALUE(emb.dim() == 2 && emb.device().is_cpu(),
                      "StepPlan.run_row: emb must be a 2-D CPU tensor, got ", emb.sizes(),
                      " on ", emb.device());
    TORCH_CHECK_INDEX(token >= 0 && token < emb.size(0), "StepPlan.run_row: token ", token,
                      " is out of range [0, ", emb.size(0), ")");
    const int64_t sizes[] = {1, emb.size(1)};
    return run(alias_of(emb, sizes, emb.strides(), emb.storage_offset() + token * emb.stride(0)),
               std::move(state));
  }

  // x: the rows' embeddings; state: the program's other inputs in order (the token ids of a
  // DeepEmbed model, then the state entries). Returns the program's results. Every call's
  // inputs must have the first call's sizes, strides, dtypes and devices (planned steps keep
  // what they checked on the first call). One call at a time (planned product steps keep state
  // between calls).
  std::vector<at::Tensor> run(at::Tensor x, std::vector<at::Tensor> state) const {
    const std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK_VALUE(static_cast<int64_t>(state.size()) + 1 == n_inputs_,
                      "StepPlan.run: the state must hold ", n_inputs_ - 1, " tensors, got ",
                      state.size());
    check_inputs(x, state);
    for (const auto& prepare : prepare_) prepare();
    Env env(static_cast<size_t>(n_slots_));
    env[0] = std::move(x);
    for (size_t i = 0; i < state.size(); ++i) env[i + 1] = std::move(state[i]);
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      if (profiling_) {
        const auto t0 = std::chrono::steady_clock::now();
        s.call(s, consts_, env);
        step_ns_[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
      } else {
        s.call(s, consts_, env);
      }
      for (const int64_t r : s.release) env[static_cast<size_t>(r)].reset();
    }
    profiled_runs_ += profiling_;
    std::vector<at::Tensor> out;
    out.reserve(results_.size());
    for (const int64_t r : results_) {
      out.push_back(r >= 0 ? std::move(env[static_cast<size_t>(r)])
                           : consts_[static_cast<size_t>(-r - 1)]);
    }
    return out;
  }

  // How many steps call their kernel unboxed, and in all (test hooks).
  int64_t typed_steps() const {
    int64_t n = 0;
    for (const Step& s : steps_) n += s.typed;
    return n;
  }
  int64_t steps() const { return static_cast<int64_t>(steps_.size()); }
  int64_t planned_steps() const { return planned_; }

  // The step profile (benchmarks/profile_cpu.py): while profiling is on, each step's wall time
  // (its op call, from the first instruction to the results) is added up over the runs; turning
  // it on starts the sums from zero. Off, a run reads the clock nowhere.
  void set_profiling(bool on) {
    const std::lock_guard<std::mutex> lock(mu_);
    profiling_ = on;
    if (on) {
      std::fill(step_ns_.begin(), step_ns_.end(), 0);
      profiled_runs_ = 0;
    }
  }
  // Per step, in order: the nanoseconds summed over the profiled runs (zeros before any).
  std::vector<int64_t> step_ns() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return step_ns_;
  }
  int64_t profiled_runs() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return profiled_runs_;
  }
  std::vector<std::string> step_ops() const {
    std::vector<std::string> out;
    for (const Step& s : steps_) out.push_back(s.op);
    return out;
  }
  std::vector<int64_t> step_weight_bytes() const {
    std::vector<int64_t> out;
    for (const Step& s : steps_) out.push_back(s.weight_bytes);
    return out;
  }

 private:
  std::vector<at::Tensor> consts_;
  int64_t n_inputs_ = 0, n_slots_ = 0;
  std::vector<Step> steps_;
  std::vector<std::function<void()>> prepare_;  // run at each call's start (Reusing's fresh)
  std::vector<int64_t> results_;
  int64_t planned_ = 0;  // steps run as planned products
  mutable std::mutex mu_;
  // The first call's inputs (sizes, strides, dtype, device), which later calls must match.
  struct InputSpec {
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    at::Device device;
  };
  mutable std::vector<InputSpec> inputs_;

  void check_inputs(const at::Tensor& x, const std::vector<at::Tensor>& state) const {
    const auto spec = [](const at::Tensor& t) {
      return InputSpec{t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device()};
    };
    const bool first = inputs_.empty();
    for (size_t i = 0; i <= state.size(); ++i) {
      const at::Tensor& t = i == 0 ? x : state[i - 1];
      TORCH_CHECK_VALUE(t.defined(), "StepPlan.run: input ", i, " is undefined");
      if (first) {
        inputs_.push_back(spec(t));
        continue;
      }
      const InputSpec& want = inputs_[i];
      TORCH_CHECK_VALUE(t.sizes().equals(want.sizes) && t.strides().equals(want.strides) &&
                            t.scalar_type() == want.dtype && t.device() == want.device,
                        "StepPlan.run: input ", i, " has sizes ", t.sizes(), ", strides ",
                        t.strides(), " and dtype ", t.scalar_type(), "; this plan takes sizes ",
                        at::IntArrayRef(want.sizes), ", strides ", at::IntArrayRef(want.strides),
                        " and dtype ", want.dtype);
    }
  }
  bool profiling_ = false;                 // set_profiling
  mutable std::vector<int64_t> step_ns_;   // per step, summed while profiling (under mu_)
  mutable int64_t profiled_runs_ = 0;
};

}  // namespace
}  // namespace cpu
}  // namespace rwkv

TORCH_LIBRARY_FRAGMENT(rwkv, m) {
  m.class_<rwkv::cpu::StepPlan>("StepPlan")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>,
                       std::vector<std::string>>())
      .def("run", &rwkv::cpu::StepPlan::run)
      .def("run_row", &rwkv::cpu::StepPlan::run_row)
      .def("typed_steps", &rwkv::cpu::StepPlan::typed_steps)
      .def("steps", &rwkv::cpu::StepPlan::steps)
      .def("planned_steps", &rwkv::cpu::StepPlan::planned_steps)
      .def("set_profiling", &rwkv::cpu::StepPlan::set_profiling)
      .def("step_ns", &rwkv::cpu::StepPlan::step_ns)
      .def("profiled_runs", &rwkv::cpu::StepPlan::profiled_runs)
      .def("step_ops", &rwkv::cpu::StepPlan::step_ops)
      .def("step_weight_bytes", &rwkv::cpu::StepPlan::step_weight_bytes);
}
