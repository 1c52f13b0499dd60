// The Autograd kernel of every rwkv tensor op (rwkv/ops/_schemas.py OPS): these ops have no
// backward. Without a kernel of our own for the Autograd key, torch's fallback for ops without
// one would run on every call: it reads requires_grad of every tensor argument (a product's
// weights and side tensors included), even under torch.no_grad(). While decoding, those tensors'
// metadata has just been evicted from the caches by the weights streamed in between, so each read
// is a cache miss.
//
// This kernel checks nothing while grad mode is off (the model always runs under no_grad), and
// with grad mode on refuses an argument that requires grad with a ValueError that says what to
// do, instead of an output whose backward fails later. Then the call goes on to the backend's
// kernel, below the autograd keys (as torch's fallback does).
//
// Registered at run time for the names Python passes (rwkv._C loads after the schemas are
// defined; rwkv/ops/_backend.py calls rwkv::_inference_only with OPS once).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace rwkv {
namespace {

bool requires_grad(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.requires_grad();
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined() && t.requires_grad()) return true;
    }
  }
  return false;
}

void inference_only(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                    torch::jit::Stack* stack) {
  if (c10::GradMode::is_enabled()) {
    const auto& args = op.schema().arguments();
    const size_t first = stack->size() - args.size();
    for (size_t i = 0; i < args.size(); ++i) {
      TORCH_CHECK_VALUE(!requires_grad((*stack)[first + i]), op.schema().name(),
                        ": argument '", args[i].name(),
                        "' requires grad, but the rwkv ops have no backward (inference only). "
                        "Call them under torch.no_grad() or torch.inference_mode(), or pass "
                        "detached tensors (.detach()).");
    }
  }
  op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
}

// Registers inference_only as the Autograd kernel of rwkv::<name> for each name not done yet.
void register_inference_only(const std::vector<std::string>& names) {
  static std::mutex mu;
  static std::set<std::string> done;
  static torch::Library* lib = nullptr;  // never destroyed: the kernels stay for the process
  std::lock_guard<std::mutex> lock(mu);
  if (lib == nullptr) {
    lib = new torch::Library(torch::Library::IMPL, "rwkv", c10::DispatchKey::Autograd, __FILE__,
                             __LINE__);
  }
  for (const std::string& name : names) {
    if (!done.insert(name).second) continue;
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&inference_only>());
  }
}

}  // namespace
}  // namespace rwkv

// Takes no tensor, so registered for CompositeExplicitAutograd (as _cpu_isa).
TORCH_LIBRARY_IMPL(rwkv, CompositeExplicitAutograd, m) {
  m.impl("_inference_only", &rwkv::register_inference_only);
}
