// module_construction.h: building modules one at a time, and placeholders.
#include "zest/torch/module_construction.h"

#include "zest/core/check.h"
#include "zest/core/trim_heap.h"
#include "zest/torch/detail/torch_module_unit.h"

namespace zest {

std::mutex& module_construction_mutex() {
  static std::mutex mutex;
  return mutex;
}

bool is_placeholder(const torch::Tensor& param) {
  return param.defined() && param.numel() > 0 && param.has_storage() && param.storage().data() == nullptr;
}

void make_placeholders(torch::nn::Module& module, const std::function<bool(const std::string& name)>& which) {
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(true)) {
    torch::Tensor p = item.value();
    if (is_placeholder(p) || (which && !which(item.key()))) continue;
    ZEST_CHECK(p.layout() == torch::kStrided, "parameter '{}' is not a dense tensor", item.key());
    const std::vector<int64_t> sizes = p.sizes().vec();
    const c10::Device cpu(torch::kCPU);
    c10::Storage none(c10::Storage::use_byte_size_t(), static_cast<size_t>(p.numel()) * p.element_size(),
                      c10::DataPtr(nullptr, cpu), nullptr, false);
    p.set_data(torch::empty({0}, p.options().device(cpu)).set_(none, 0, sizes, contiguous_strides(sizes)));
  }
  trim_heap();
}

}  // namespace zest
