//! Raising a failed allocation inside PyTorch.
//!
//! PyTorch's pluggable allocator does not check what its `alloc` function returns: a
//! NULL would become a tensor at address 0 and the first kernel touching it an
//! illegal-address error that poisons the CUDA context. It offers no out-of-memory
//! observer either (`attachOutOfMemoryObserver` is refused for pluggable allocators).
//! What it does offer is its own error path: `c10::detail::torchCheckFail`, the function
//! behind `TORCH_CHECK`, throws a `c10::Error` that PyTorch turns into a Python
//! `RuntimeError` at the operator that allocated. So when `curt_torch_alloc` fails
//! inside a process where PyTorch's `libc10.so` is loaded, it calls that function with
//! cuda-rt's message (out of memory with the pool's figures, a bad device...), and the
//! C++ exception unwinds through the `extern "C-unwind"` entry point back into
//! PyTorch, which holds no lock around the call. Elsewhere (a C program, CuPy) the
//! NULL and `curt_last_error()` stay the answer.

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

/// `c10::detail::torchCheckFail(const char* func, const char* file, uint32_t line,
/// const char* msg)`, which throws.
type CheckFail = unsafe extern "C-unwind" fn(*const c_char, *const c_char, u32, *const c_char);

const SYMBOL: &std::ffi::CStr = c"_ZN3c106detail14torchCheckFailEPKcS2_jS2_";

/// PyTorch's `torchCheckFail`, when `libc10.so` is already loaded in this process
/// (never loaded by cuda-rt itself).
fn check_fail() -> Option<CheckFail> {
    static FOUND: OnceLock<usize> = OnceLock::new();
    let addr = *FOUND.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only looks up a library already loaded (no initialiser
        // runs); the handle is released at once, the library staying loaded by whoever
        // loaded it (PyTorch never unloads libc10).
        unsafe {
            let h = libc::dlopen(c"libc10.so".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if h.is_null() {
                return 0;
            }
            let sym = libc::dlsym(h, SYMBOL.as_ptr());
            libc::dlclose(h);
            sym as usize
        }
    });
    (addr != 0).then(|| {
        // SAFETY: `addr` is libc10's `torchCheckFail` with the signature above
        // (its mangled name fixes the parameter types; the C++ ABI passes them as C).
        unsafe { std::mem::transmute::<*mut c_void, CheckFail>(addr as *mut c_void) }
    })
}

/// Throws `message` as a `c10::Error` into PyTorch, if PyTorch is loaded; returns
/// (doing nothing) otherwise. Must be called outside any `catch_unwind` and from a
/// function whose ABI allows unwinding (`extern "C-unwind"`).
pub(super) fn raise_in_torch(message: &str) {
    let Some(fail) = check_fail() else {
        return;
    };
    let msg = CString::new(format!("cuda-rt: {}", message.replace('\0', " "))).unwrap_or_default();
    // SAFETY: `fail` is torchCheckFail (above); the strings live across the call, which
    // copies them before it throws. The exception unwinds through this frame (dropping
    // `msg`) and the `C-unwind` entry point into PyTorch's caller.
    unsafe {
        fail(
            c"curt_torch_alloc".as_ptr(),
            c"cuda-rt".as_ptr(),
            0,
            msg.as_ptr(),
        )
    };
}
