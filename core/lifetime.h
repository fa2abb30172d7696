// Lets what borrows an object tell whether the object still exists, for
// borrowers that may outlive it by mistake (a handle kept past its engine, an
// engine kept past its allocator): they fail with an error naming the
// object, or skip giving back what it already let go, instead of touching
// freed memory.
//
//   // zest-example: run
//   struct Model { Lifetime lifetime; };                          // the object
//   auto model = std::make_unique<Model>();
//   std::weak_ptr<const void> watch = model->lifetime.watch();    // a borrower
//   model.reset();
//   if (!watch.expired()) throw std::logic_error("the model is gone: the borrower must see it");
//
// The check is one atomic load. It tells destruction apart, not concurrent
// destruction: an object destroyed while another thread uses it is a race
// the owner must prevent.
#pragma once

#include <memory>

namespace zest {

class Lifetime {
 public:
  Lifetime() = default;
  // A copy or an assignment is another object, watched on its own.
  Lifetime(const Lifetime&) : Lifetime() {}
  Lifetime& operator=(const Lifetime&) { return *this; }
  ~Lifetime() = default;

  // Expires when the object holding this Lifetime is destroyed.
  std::weak_ptr<const void> watch() const { return token_; }

 private:
  std::shared_ptr<const int> token_ = std::make_shared<const int>(0);
};

}  // namespace zest
