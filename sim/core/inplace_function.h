// inplace_function.h — a move-only callable with inline storage and no heap allocation.
//
// The event queue stores one per event, so a callable that does not fit is a compile error,
// not a hidden allocation on the hot path:
//
//   InplaceFunction<void(), 48> f = [p, n] { p->wake(n); };
//   f();
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace cubesim::sim {

template <class Sig, std::size_t Capacity>
class InplaceFunction;

template <class R, class... Args, std::size_t Capacity>
class InplaceFunction<R(Args...), Capacity> {
 public:
  InplaceFunction() = default;

  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, InplaceFunction>>>
  InplaceFunction(F&& f) {  // NOLINT(google-explicit-constructor): used like std::function
    emplace(std::forward<F>(f));
  }

  // Constructs the callable in place (no intermediate moves). Precondition: empty.
  template <class F, class D = std::decay_t<F>>
  void emplace(F&& f) {
    static_assert(sizeof(D) <= Capacity,
                  "callable too large for InplaceFunction: capture less (pointers, not copies)");
    static_assert(alignof(D) <= alignof(std::max_align_t), "over-aligned callable");
    static_assert(std::is_nothrow_move_constructible_v<D>, "callable must be nothrow-movable");
    ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
    invoke_ = [](void* p, Args... a) -> R { return (*static_cast<D*>(p))(std::forward<Args>(a)...); };
    if constexpr (!std::is_trivially_copyable_v<D> || !std::is_trivially_destructible_v<D>) {
      manage_ = [](void* dst, void* src) {
        if (dst) ::new (dst) D(std::move(*static_cast<D*>(src)));
        static_cast<D*>(src)->~D();
      };
    }
  }

  InplaceFunction(InplaceFunction&& o) noexcept { take(o); }
  InplaceFunction& operator=(InplaceFunction&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  InplaceFunction(const InplaceFunction&) = delete;
  InplaceFunction& operator=(const InplaceFunction&) = delete;
  ~InplaceFunction() { reset(); }

  explicit operator bool() const { return invoke_ != nullptr; }
  R operator()(Args... a) { return invoke_(buf_, std::forward<Args>(a)...); }

  void reset() {
    if (manage_) manage_(nullptr, buf_);
    invoke_ = nullptr;
    manage_ = nullptr;
  }

 private:
  void take(InplaceFunction& o) {
    invoke_ = o.invoke_;
    manage_ = o.manage_;
    if (manage_) {
      manage_(buf_, o.buf_);
    } else if (invoke_) {
      std::memcpy(buf_, o.buf_, Capacity);
    }
    o.invoke_ = nullptr;
    o.manage_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buf_[Capacity];
  R (*invoke_)(void*, Args...) = nullptr;
  void (*manage_)(void* dst, void* src) = nullptr;  // null: trivially relocatable
};

}  // namespace cubesim::sim
