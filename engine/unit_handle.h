// Scoped access to one unit's parameters and gradients during forward and
// backward.
//
//   // zest-example: prelude=engine
//   {
//     zest::UnitHandle fc = engine.gather(unit);          // stage 3: all-gathered here
//     const float* w = fc.param<float>("fc1.weight").data();
//     (void)w;  // forward
//   }                                                    // stage 3: released here (or kept for its reuse)
//   {
//     zest::UnitHandle fc = engine.gather(unit);
//     zest::GradHandle g = engine.grads(unit);           // zeroed at a micro-step's first use
//     std::span<float> dw = g.grad<float>("fc1.weight"); // backward: accumulate into dw
//     (void)dw;
//     g.done();                                          // reduced from here on
//   }
//
// Views point at the engine's device memory (host memory on the host
// backend) and are valid while the handle lives. The element type must be
// the compute dtype (float, fp16 or bf16); raw pointers are there for the
// user's own kernels and cuBLAS calls.
//
// A handle borrows its engine: using one after the engine was destroyed
// throws an Error, and destroying it then does nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "zest/core/dtype.h"

namespace zest {

class Engine;

namespace detail {
// A view's elements before its type is applied: one lookup yields both.
template <typename V>
struct UntypedSpan {
  V* data = nullptr;
  size_t numel = 0;
};
}  // namespace detail

class UnitHandle {
 public:
  UnitHandle() = default;
  ~UnitHandle();
  UnitHandle(UnitHandle&& other) noexcept;
  UnitHandle& operator=(UnitHandle&& other) noexcept;
  UnitHandle(const UnitHandle&) = delete;
  UnitHandle& operator=(const UnitHandle&) = delete;

  int unit() const { return unit_; }
  explicit operator bool() const { return engine_ != nullptr; }

  // The parameter's elements in the compute dtype. Throws for an unknown
  // name, a parameter of another unit, or a T that is not the compute dtype.
  const void* param_data(const std::string& name) const;
  template <typename T>
  std::span<const T> param(const std::string& name) const {
    const detail::UntypedSpan<const void> v = typed_param(name, dtype_of_v<T>);
    return {static_cast<const T*>(v.data), v.numel};
  }

  // The unit's whole flat parameter buffer in the compute dtype
  // (layout().unit(u).padded elements; each parameter at its
  // ParamLayout::offset), for adapters that view a unit as one block, such
  // as torch/. At stage 3 it moves between gathers.
  const void* data() const;

  // Gives the unit back now rather than at scope end.
  void release();

 private:
  friend class Engine;
  UnitHandle(Engine* engine, std::weak_ptr<const void> alive, int unit)
      : engine_(engine), alive_(std::move(alive)), unit_(unit) {}
  detail::UntypedSpan<const void> typed_param(const std::string& name, DType dtype) const;
  // The engine, checked to exist; throws naming `what` otherwise.
  Engine& engine(const char* what) const;

  Engine* engine_ = nullptr;
  std::weak_ptr<const void> alive_;
  int unit_ = -1;
};

class GradHandle {
 public:
  GradHandle() = default;
  GradHandle(GradHandle&& other) noexcept;
  GradHandle& operator=(GradHandle&& other) noexcept;
  GradHandle(const GradHandle&) = delete;
  GradHandle& operator=(const GradHandle&) = delete;
  ~GradHandle() = default;

  int unit() const { return unit_; }

  // The parameter's gradient in the compute dtype, for this micro-step:
  // zeroed when the micro-step first asked for the unit, so backward adds
  // into it. Throws after done().
  void* grad_data(const std::string& name) const;
  template <typename T>
  std::span<T> grad(const std::string& name) const {
    const detail::UntypedSpan<void> v = typed_grad(name, dtype_of_v<T>);
    return {static_cast<T*>(v.data), v.numel};
  }

  // The unit's whole flat gradient buffer for this micro-step, laid out as
  // UnitHandle::data(). At stages 2-3 it is a new buffer every micro-step.
  // Throws after done().
  void* data() const;

  // The unit's gradients for this micro-step are complete: the engine
  // reduces them (in buckets, on its communication stream) while backward
  // goes on. Every unit must be done once per micro-step before step().
  void done();

 private:
  friend class Engine;
  GradHandle(Engine* engine, std::weak_ptr<const void> alive, int unit)
      : engine_(engine), alive_(std::move(alive)), unit_(unit) {}
  detail::UntypedSpan<void> typed_grad(const std::string& name, DType dtype) const;
  Engine& engine(const char* what) const;

  Engine* engine_ = nullptr;
  std::weak_ptr<const void> alive_;
  int unit_ = -1;
};

}  // namespace zest
