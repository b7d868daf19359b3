// See fake_c10.h. Built by tests/c_shim.rs as libc10.so (soname libc10.so).
#include "fake_c10.h"

namespace c10 {

Error::Error(SourceLocation source_location, std::string msg)
    : msg_(std::move(msg)),
      what_(msg_ + " (raised from " + source_location.function + ")"),
      caller_(nullptr),
      function_(source_location.function) {}

const char* Error::what() const noexcept { return what_.c_str(); }

const char* Error::where() const { return function_; }

namespace detail {
void torchCheckFail(const char* func, const char* file, uint32_t line, const char* msg) {
  throw Error({func, file, line}, msg);
}
}  // namespace detail

void fake_throw_out_of_memory(const char* msg) {
  throw OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg);
}

}  // namespace c10
