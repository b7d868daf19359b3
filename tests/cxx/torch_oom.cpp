// curt_torch_alloc inside a process with (a stand-in for) PyTorch's libc10.so: out of
// memory arrives as c10::OutOfMemoryError (PyTorch's Python layer turns that type into
// torch.cuda.OutOfMemoryError), any other failure as a plain c10::Error, and the
// process goes on allocating. Run by tests/c_shim.rs with the fake driver
// (scripts/fake-libcuda.c) and a pool limit of 1 MiB. Prints "TORCH OOM PASSED" last.
#include <cstdio>
#include <cstring>
#include <typeinfo>

#include "../../wrapper.h"
#include "fake_c10.h"

static int failures = 0;

static void check(bool ok, const char* what, const char* detail = "") {
  std::printf("%s %s %s\n", ok ? "ok  " : "FAIL", what, detail);
  if (!ok) failures++;
}

static bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

int main() {
  check(curt_pool_set_limit(1 << 20) == CURT_SUCCESS, "pool limit of 1 MiB", curt_last_error());

  try {
    void* p = curt_torch_alloc(1 << 30, 0, nullptr);
    check(false, "1 GiB past the limit threw", p ? "returned memory" : "returned NULL");
  } catch (const c10::OutOfMemoryError& e) {
    check(true, "out of memory is c10::OutOfMemoryError");
    check(starts_with(e.msg(), "CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0"),
          "with torch's opening", e.msg().c_str());
    check(std::strstr(e.msg().c_str(), "limit") != nullptr, "and cuda-rt's figures", e.msg().c_str());
    check(typeid(e) == typeid(c10::OutOfMemoryError), "its dynamic type is OutOfMemoryError");
    check(std::strstr(e.what(), "(raised from curt_torch_alloc)") != nullptr, "built by Error's constructor",
          e.what());
  } catch (const c10::Error& e) {
    check(false, "out of memory is c10::OutOfMemoryError", "a plain c10::Error");
  } catch (...) {
    check(false, "out of memory is c10::OutOfMemoryError", "another exception");
  }

  try {
    curt_torch_alloc(-5, 0, nullptr);
    check(false, "a negative size threw");
  } catch (const c10::OutOfMemoryError&) {
    check(false, "a negative size is a plain c10::Error", "an OutOfMemoryError");
  } catch (const c10::Error& e) {
    check(std::strstr(e.msg().c_str(), "negative size") != nullptr, "a negative size is a plain c10::Error",
          e.msg().c_str());
  }

  // Many times over: nothing leaks or breaks along the way, and the pool still serves.
  int caught = 0;
  for (int i = 0; i < 1000; i++) {
    try {
      curt_torch_alloc(1 << 21, 0, nullptr);
    } catch (const c10::OutOfMemoryError&) {
      caught++;
    }
  }
  check(caught == 1000, "a thousand more out-of-memory errors, each caught");
  void* p = curt_torch_alloc(4096, 0, nullptr);
  check(p != nullptr, "the process goes on allocating", curt_last_error());
  curt_torch_free(p, 4096, 0, nullptr);
  size_t live = 99;
  check(curt_dropin_live_count(&live) == CURT_SUCCESS && live == 0, "nothing left allocated");

  std::printf("%s\n", failures ? "TORCH OOM FAILED" : "TORCH OOM PASSED");
  return failures ? 1 : 0;
}
