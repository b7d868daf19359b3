//! Raising a failed allocation inside PyTorch, as the type PyTorch's own allocator
//! raises.
//!
//! PyTorch's pluggable allocator does not check what its `alloc` function returns: a
//! NULL would become a tensor at address 0 and the first kernel touching it an
//! illegal-address error that poisons the CUDA context. It offers no out-of-memory
//! observer either (`attachOutOfMemoryObserver` is refused for pluggable allocators).
//! What it does offer is its own error path: a C++ exception thrown from the allocator
//! unwinds back to the operator that allocated, where PyTorch turns it into a Python
//! exception by its C++ type: `c10::OutOfMemoryError` becomes
//! `torch.cuda.OutOfMemoryError` ("CUDA out of memory. Tried to allocate ..."), which
//! batch-size back-off code catches by type, and any other `c10::Error` a
//! `RuntimeError`. So when `curt_torch_alloc` fails inside a process where PyTorch's
//! `libc10.so` is loaded (never loaded by cuda-rt itself), it throws:
//!
//! - out of memory: a `c10::OutOfMemoryError`, built as PyTorch's `C10_THROW_ERROR`
//!   builds one: the exception object allocated by the C++ runtime
//!   (`__cxa_allocate_exception`), constructed by `c10::Error`'s exported constructor
//!   `Error(SourceLocation, std::string)` (the string made by libstdc++'s exported
//!   constructor), given `OutOfMemoryError`'s vtable when a library exports it (the
//!   class adds no member: `using Error::Error`), and thrown with
//!   `OutOfMemoryError`'s type information (`__cxa_throw`) and its destructor (Error's
//!   where exported, else the one in OutOfMemoryError's vtable: PyTorch builds with
//!   hidden inline functions, so its libc10 exports none), which is what PyTorch's
//!   `catch` matches. Every piece is looked up by its mangled name, which spells the
//!   parameter types, in the libraries already loaded; for the two string ABIs of
//!   libstdc++ the pair that libc10 was built with is used;
//! - anything else, or where a piece is missing: `c10::detail::torchCheckFail`, the
//!   function behind `TORCH_CHECK`, which throws a `c10::Error` (a `RuntimeError`)
//!   with the same text.
//!
//! The exception unwinds through the `extern "C-unwind"` entry point back into
//! PyTorch, which holds no lock around the call. Elsewhere (a C program, CuPy) the
//! NULL and `curt_last_error()` stay the answer.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

/// `c10::detail::torchCheckFail(const char* func, const char* file, uint32_t line,
/// const char* msg)`, which throws.
type CheckFail = unsafe extern "C-unwind" fn(*const c_char, *const c_char, u32, *const c_char);

const CHECK_FAIL: &CStr = c"_ZN3c106detail14torchCheckFailEPKcS2_jS2_";

/// `c10::SourceLocation`: a trivially copyable struct, passed by value as C passes it.
#[repr(C)]
#[derive(Clone, Copy)]
struct SourceLocation {
    function: *const c_char,
    file: *const c_char,
    line: u32,
}

/// `c10::Error::Error(SourceLocation, std::string)` (complete-object constructor): the
/// object, the location, and the string passed as the Itanium ABI passes a class with
/// a non-trivial destructor, by the address of a temporary the caller destroys.
type ErrorCtor = unsafe extern "C-unwind" fn(*mut c_void, SourceLocation, *mut c_void);
/// `std::string(const char*, const std::allocator<char>&)`, which may throw
/// `std::bad_alloc`.
type StringCtor = unsafe extern "C-unwind" fn(*mut c_void, *const c_char, *const c_void);
/// A destructor: `std::string::~string()`, `c10::Error::~Error()`.
type Dtor = unsafe extern "C" fn(*mut c_void);
/// `__cxa_allocate_exception(size_t)`.
type AllocException = unsafe extern "C" fn(usize) -> *mut c_void;
/// `__cxa_throw(void* object, std::type_info* type, void (*dtor)(void*))`.
type Throw = unsafe extern "C-unwind" fn(*mut c_void, *const c_void, Option<Dtor>) -> !;

/// The mangled names of one of libstdc++'s two string ABIs.
struct StringAbi {
    error_ctor: &'static CStr,
    string_ctor: &'static CStr,
    string_dtor: &'static CStr,
}

const ABIS: [StringAbi; 2] = [
    // `std::__cxx11::basic_string` (GCC 5's ABI, PyTorch's wheels since 2.7 and conda).
    StringAbi {
        error_ctor: c"_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
        string_ctor: c"_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC1EPKcRKS3_",
        string_dtor: c"_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev",
    },
    // The old copy-on-write `std::string` (`_GLIBCXX_USE_CXX11_ABI=0`, older wheels).
    StringAbi {
        error_ctor: c"_ZN3c105ErrorC1ENS_14SourceLocationESs",
        string_ctor: c"_ZNSsC1EPKcRKSaIcE",
        string_dtor: c"_ZNSsD1Ev",
    },
];

const ERROR_DTOR: &CStr = c"_ZN3c105ErrorD1Ev";
const OOM_TYPEINFO: &CStr = c"_ZTIN3c1016OutOfMemoryErrorE";
const OOM_VTABLE: &CStr = c"_ZTVN3c1016OutOfMemoryErrorE";

/// The libraries of a PyTorch process that hold `OutOfMemoryError`'s type information
/// or vtable (emitted where the class is thrown or caught): libc10_cuda throws it,
/// torch's Python extension catches it.
const TORCH_LIBRARIES: [&CStr; 5] = [
    c"libc10.so",
    c"libc10_cuda.so",
    c"libtorch_python.so",
    c"libtorch_cuda.so",
    c"libtorch_cpu.so",
];

/// Bytes asked of `__cxa_allocate_exception` for the `c10::Error`: larger than any
/// PyTorch's (about 130 to 170 bytes: a vtable pointer, strings, a vector, a
/// backtrace), the rest unused.
const ERROR_SPACE: usize = 1024;
/// Bytes of the temporary `std::string` (32 with the new ABI, 8 with the old).
const STRING_SPACE: usize = 64;

/// What throwing a `c10::OutOfMemoryError` takes, resolved once.
struct OomThrower {
    error_ctor: ErrorCtor,
    error_dtor: Dtor,
    string_ctor: StringCtor,
    string_dtor: Dtor,
    alloc: AllocException,
    throw: Throw,
    typeinfo: *const c_void,
    /// `OutOfMemoryError`'s vtable (its address point), where a library exports it.
    vtable: Option<*const c_void>,
}

// SAFETY: plain function and data addresses of loaded libraries that are never
// unloaded (PyTorch never unloads its libraries, libstdc++ stays with them).
unsafe impl Send for OomThrower {}
// SAFETY: as above; nothing in it is mutated.
unsafe impl Sync for OomThrower {}

/// A handle of `name` when it is already loaded in this process (no initialiser runs),
/// released at once: the library stays loaded by whoever loaded it, and its symbols'
/// addresses stay valid (PyTorch never unloads its libraries).
fn loaded(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_NOLOAD only looks up a library already loaded.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    (!h.is_null()).then_some(h)
}

/// The address of `symbol` in the first of `libraries` that is loaded and defines it.
fn find(libraries: &[&CStr], symbol: &CStr) -> Option<*mut c_void> {
    libraries.iter().find_map(|lib| {
        let h = loaded(lib)?;
        // SAFETY: `h` is a live handle; `symbol` is NUL-terminated.
        let sym = unsafe { libc::dlsym(h, symbol.as_ptr()) };
        // SAFETY: `h` came from dlopen; the library stays loaded (see `loaded`).
        unsafe { libc::dlclose(h) };
        (!sym.is_null()).then_some(sym)
    })
}

/// PyTorch's `torchCheckFail`, when `libc10.so` is already loaded in this process.
fn check_fail() -> Option<CheckFail> {
    static FOUND: OnceLock<usize> = OnceLock::new();
    let addr = *FOUND.get_or_init(|| find(&[c"libc10.so"], CHECK_FAIL).map_or(0, |p| p as usize));
    (addr != 0).then(|| {
        // SAFETY: `addr` is libc10's `torchCheckFail` with the signature above
        // (its mangled name fixes the parameter types; the C++ ABI passes them as C).
        unsafe { std::mem::transmute::<*mut c_void, CheckFail>(addr as *mut c_void) }
    })
}

/// What throwing a `c10::OutOfMemoryError` takes, when every piece is loaded.
fn oom_thrower() -> Option<&'static OomThrower> {
    static FOUND: OnceLock<Option<OomThrower>> = OnceLock::new();
    FOUND.get_or_init(resolve_oom_thrower).as_ref()
}

fn resolve_oom_thrower() -> Option<OomThrower> {
    let c10 = [c"libc10.so"];
    let cxx = [c"libstdc++.so.6"];
    // The string ABI libc10 was built with: the one whose constructor it exports.
    let (abi, error_ctor) = ABIS
        .iter()
        .find_map(|abi| Some((abi, find(&c10, abi.error_ctor)?)))?;
    let string_ctor = find(&cxx, abi.string_ctor)?;
    let string_dtor = find(&cxx, abi.string_dtor)?;
    let alloc = find(&cxx, c"__cxa_allocate_exception")?;
    let throw = find(&cxx, c"__cxa_throw")?;
    let typeinfo = find(&TORCH_LIBRARIES, OOM_TYPEINFO)?;
    // The symbol is the vtable's start: offset to top and type information come before
    // the address point an object's vtable pointer holds.
    let vtable = find(&TORCH_LIBRARIES, OOM_VTABLE).map(|v| {
        v.cast::<*const c_void>()
            .wrapping_add(2)
            .cast::<c_void>()
            .cast_const()
    });
    // PyTorch builds with -fvisibility-inlines-hidden: Error's implicit destructor is
    // not exported (PyTorch 2.9's libc10.so has none). The vtable's first slot holds
    // it then: OutOfMemoryError's primary base chain starts at std::exception, whose
    // first virtual function is its destructor, so the slot at the address point is
    // OutOfMemoryError's complete-object destructor (Itanium C++ ABI).
    let error_dtor = match find(&c10, ERROR_DTOR) {
        Some(d) => d,
        // SAFETY: the address point of a vtable in a loaded library: its first slot
        // is a relocated function address, readable for as long as the library stays
        // loaded (PyTorch never unloads it).
        None => unsafe { vtable?.cast::<*mut c_void>().read() },
    };
    if error_dtor.is_null() {
        return None;
    }
    // SAFETY: each address is the function its mangled (or C) name declares, with the
    // signature of the type it is cast to (see the types above); dlsym found them in
    // loaded libraries that stay loaded.
    unsafe {
        Some(OomThrower {
            error_ctor: std::mem::transmute::<*mut c_void, ErrorCtor>(error_ctor),
            error_dtor: std::mem::transmute::<*mut c_void, Dtor>(error_dtor),
            string_ctor: std::mem::transmute::<*mut c_void, StringCtor>(string_ctor),
            string_dtor: std::mem::transmute::<*mut c_void, Dtor>(string_dtor),
            alloc: std::mem::transmute::<*mut c_void, AllocException>(alloc),
            throw: std::mem::transmute::<*mut c_void, Throw>(throw),
            typeinfo: typeinfo.cast_const(),
            vtable,
        })
    }
}

fn c_message(message: &str) -> CString {
    CString::new(message.replace('\0', " ")).unwrap_or_default()
}

/// Throws `message` as a `c10::Error` (a Python `RuntimeError`) into PyTorch, if
/// PyTorch is loaded; returns (doing nothing) otherwise. Must be called outside any
/// `catch_unwind` and from a function whose ABI allows unwinding (`extern "C-unwind"`).
pub(super) fn raise_in_torch(message: &str) {
    let Some(fail) = check_fail() else {
        return;
    };
    let msg = c_message(&format!("cuda-rt: {message}"));
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

/// Throws `message` as a `c10::OutOfMemoryError` (Python's
/// `torch.cuda.OutOfMemoryError`) into PyTorch when PyTorch is loaded and exports what
/// it takes, else as [`raise_in_torch`] does; returns (doing nothing) where PyTorch is
/// not loaded. The same calling rules as [`raise_in_torch`].
pub(super) fn raise_oom_in_torch(message: &str) {
    let Some(t) = oom_thrower() else {
        return raise_in_torch(message);
    };
    let msg = c_message(message);
    let loc = SourceLocation {
        function: c"curt_torch_alloc".as_ptr(),
        file: c"cuda-rt".as_ptr(),
        line: 0,
    };
    // Room for the temporary std::string, aligned as it needs (pointer alignment).
    let mut string = [0usize; STRING_SPACE / std::mem::size_of::<usize>()];
    let string_at = string.as_mut_ptr().cast::<c_void>();
    let allocator = 0u8; // std::allocator<char> is empty: any address stands for it
                         // SAFETY: each function is what `resolve_oom_thrower` found under its mangled name,
                         // called as the Itanium C++ ABI calls it: `string_at` is writable room for a
                         // std::string, constructed, passed by address to Error's constructor (which copies
                         // or moves from it) and destroyed after, as a caller of a by-value class parameter
                         // does; `exc` is room from the C++ runtime larger than a c10::Error, constructed
                         // once; the vtable pointer (the first word of a class with virtual functions and
                         // a primary base) is replaced by OutOfMemoryError's, which derives from Error adding
                         // no member; `__cxa_throw` takes over the object with OutOfMemoryError's type
                         // information and Error's destructor (OutOfMemoryError has no other), and unwinds
                         // through this frame (`msg` dropped on the way) into PyTorch's `catch`.
    unsafe {
        (t.string_ctor)(string_at, msg.as_ptr(), (&allocator as *const u8).cast());
        let exc = (t.alloc)(ERROR_SPACE);
        std::ptr::write_bytes(exc.cast::<u8>(), 0, ERROR_SPACE);
        (t.error_ctor)(exc, loc, string_at);
        (t.string_dtor)(string_at);
        if let Some(vtable) = t.vtable {
            exc.cast::<*const c_void>().write(vtable);
        }
        (t.throw)(exc, t.typeinfo, Some(t.error_dtor));
    }
}

/// `bytes` as PyTorch's out-of-memory message writes sizes: bytes up to 1 KiB, then
/// KiB, MiB or GiB with two decimals.
pub(super) fn format_size(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", b / K)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", b / (K * K))
    } else {
        format!("{:.2} GiB", b / (K * K * K))
    }
}

/// The text of an out-of-memory error thrown into PyTorch: PyTorch's own opening
/// (what code matching on it looks for), then cuda-rt's figures.
pub(super) fn out_of_memory_message(size: usize, device: i32, detail: &str) -> String {
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {device}: cuda-rt's caching pool: {detail}",
        format_size(size as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_pytorchs_do() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
        let m = out_of_memory_message(2 << 30, 1, "out of memory: ...");
        assert!(
            m.starts_with("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1"),
            "{m}"
        );
    }

    #[test]
    fn without_pytorch_nothing_is_thrown() {
        // No libc10 in this process: both return, and the caller returns NULL.
        raise_in_torch("x");
        raise_oom_in_torch("y");
    }
}
