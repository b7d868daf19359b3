// A stand-in for PyTorch's libc10.so with the parts of c10/util/Exception.h that the
// shim's out-of-memory path uses: c10::Error (a std::exception holding its message,
// constructed from a SourceLocation and a std::string, exported), c10::OutOfMemoryError
// (an Error adding nothing: `using Error::Error`) and c10::detail::torchCheckFail. The
// shim finds them by their mangled names in a loaded "libc10.so", as it finds PyTorch's.
#ifndef CURT_FAKE_C10_H
#define CURT_FAKE_C10_H

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace c10 {

struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};

class Error : public std::exception {
  std::string msg_;
  std::vector<std::string> context_;
  std::string what_;
  const void* caller_;

 public:
  Error(SourceLocation source_location, std::string msg);
  const char* what() const noexcept override;
  const std::string& msg() const { return msg_; }
  const char* where() const;

 private:
  const char* function_;
};

class OutOfMemoryError : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void torchCheckFail(const char* func, const char* file, uint32_t line, const char* msg);
}  // namespace detail

// Throws an OutOfMemoryError, as libc10_cuda's caching allocator does (and so emits
// the class's type information and vtable in this library, as there).
[[noreturn]] void fake_throw_out_of_memory(const char* msg);

}  // namespace c10

#endif
