// Lets what borrows an object tell whether the object still exists, for
// borrowers that may outlive it by mistake (a handle kept past its engine, an
// engine kept past its allocator): they fail with an error naming the
// object, or skip giving back what it already let go, instead of touching
// freed memory.
//
//   class Engine { Lifetime lifetime_; ... };                 // the object
//   std::weak_ptr<const void> watch = engine.lifetime_.watch();  // a borrower
//   if (watch.expired()) ... the engine is gone ...
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
