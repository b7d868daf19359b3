//! Memory hooks (CuPy's `cupy.cuda.memory_hook`): callbacks around the caching pool's
//! mallocs and frees, registered per thread under a unique name.
//!
//! # Call order (CuPy's)
//! For a [`MemoryPool`](super::MemoryPool) malloc of `size` bytes (`mem_size` is the
//! size rounded up to 512 bytes):
//! 1. `malloc_pre(device, size, mem_size)`;
//! 2. only when the pool must get new memory from the driver: `alloc_pre(device,
//!    mem_size)`, then, if the driver gave it, `alloc_post(device, mem_size, mem_ptr)`
//!    (an out-of-memory retry calls this pair again);
//! 3. `malloc_post(device, size, mem_size, mem_ptr, pmem_id)`, on success only.
//!
//! When pooled memory is freed (its last [`MemoryPointer`](super::MemoryPointer) is
//! dropped): `free_pre(device, mem_size, mem_ptr, pmem_id)`, then the block goes
//! back to the pool, then `free_post(...)` with the same arguments. `pmem_id`
//! identifies the pooled memory object (its address), the same at malloc and free.
//! `malloc(0)` is not pooled and calls no hook. Hooks run on the thread that
//! mallocs or frees, in registration order, and only that thread's hooks run.
//!
//! # Cost when unused
//! A thread with no hook pays one thread-local `bool` test per malloc and per free.
//!
//! # Built-in hooks
//! [`DebugPrintHook`] writes one JSON line per event (CuPy's format; with the `serde`
//! feature, on by default);
//! [`LineProfileHook`] sums allocated, newly acquired and still-in-use bytes per call site (from
//! `#[track_caller]`: the line that called [`alloc`](super::alloc) or
//! [`MemoryPool::malloc`](super::MemoryPool::malloc)) and prints them as a tree.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use std::rc::Rc;
//! use cuda_rt::memory::{self, hook};
//! let profile = Rc::new(hook::LineProfileHook::new());
//! {
//!     let _guard = hook::register_hook("profile", profile.clone())?;
//!     let _a = memory::alloc(1 << 20)?;
//! } // the guard unregisters the hook
//! print!("{}", profile.report());
//! # Ok(()) }
//! ```

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::panic::Location;
use std::rc::Rc;

use crate::error::{human_bytes, ArgumentKind, Error, Result};

/// Callbacks around pool mallocs and frees; every method has an empty default body,
/// so a hook implements only what it needs. See the [module doc](self) for the order.
/// Hooks are per thread, so they need not be `Send`; use `Cell`/`RefCell` for state.
pub trait MemoryHook {
    /// Before a malloc of `size` bytes (`mem_size`: rounded to 512) on `device`.
    fn malloc_pre(&self, _device: i32, _size: usize, _mem_size: usize) {}
    /// Before the pool asks the driver for `mem_size` new bytes on `device`.
    fn alloc_pre(&self, _device: i32, _mem_size: usize) {}
    /// After the driver gave the pool `mem_size` bytes at `mem_ptr`.
    fn alloc_post(&self, _device: i32, _mem_size: usize, _mem_ptr: u64) {}
    /// After a successful malloc: the block at `mem_ptr` of `mem_size` bytes, held by
    /// the pooled memory object `pmem_id`.
    fn malloc_post(
        &self,
        _device: i32,
        _size: usize,
        _mem_size: usize,
        _mem_ptr: u64,
        _pmem_id: usize,
    ) {
    }
    /// Before pooled memory goes back to its pool.
    fn free_pre(&self, _device: i32, _mem_size: usize, _mem_ptr: u64, _pmem_id: usize) {}
    /// After pooled memory went back to its pool.
    fn free_post(&self, _device: i32, _mem_size: usize, _mem_ptr: u64, _pmem_id: usize) {}
}

type HookList = Vec<(String, Rc<dyn MemoryHook>)>;

thread_local! {
    /// Whether any hook is registered on this thread: the one test the pool makes.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// This thread's hooks in registration order. Copy-on-write behind an `Rc`, so a
    /// dispatch holds no borrow while hooks run (a hook may register or drop hooks).
    static HOOKS: RefCell<Rc<HookList>> = RefCell::new(Rc::new(Vec::new()));
    /// The call site of the malloc whose hooks are running on this thread.
    static CALL_SITE: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// Whether this thread has a hook registered (what the pool tests on its hot path).
#[inline]
pub fn has_hooks() -> bool {
    ACTIVE.with(Cell::get)
}

/// Unregisters its hook when dropped (not `Send`: hooks belong to a thread).
#[must_use = "dropping the guard unregisters the hook at once"]
#[derive(Debug)]
pub struct HookGuard {
    name: String,
    _thread: PhantomData<Rc<()>>,
}

impl HookGuard {
    /// The name the hook is registered under.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        unregister_hook(&self.name);
    }
}

/// Registers `hook` on this thread under `name` until the returned guard is dropped.
/// A name already registered on this thread is [`Error::InvalidArgument`] (CuPy's
/// rule); the same hook object may be registered under two names.
pub fn register_hook(name: impl Into<String>, hook: Rc<dyn MemoryHook>) -> Result<HookGuard> {
    let name = name.into();
    HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        if h.iter().any(|(n, _)| *n == name) {
            return Err(Error::invalid_argument(
                ArgumentKind::AlreadyExists,
                format!(
                    "a memory hook named {name:?} is already registered on this thread; \
                     hook names must be unique"
                ),
            ));
        }
        Rc::make_mut(&mut h).push((name.clone(), hook));
        ACTIVE.with(|a| a.set(true));
        Ok(HookGuard {
            name,
            _thread: PhantomData,
        })
    })
}

/// Unregisters the hook named `name` on this thread; `false` if there was none.
pub fn unregister_hook(name: &str) -> bool {
    // The hook is dropped once the registry is released: its drop may use the registry
    // (a hook that owns another hook's guard, or asks for the names).
    let removed = HOOKS
        .try_with(|h| {
            let mut h = h.try_borrow_mut().ok()?;
            let i = h.iter().position(|(n, _)| n == name)?;
            let removed = Rc::make_mut(&mut h).remove(i);
            ACTIVE.with(|a| a.set(!h.is_empty()));
            Some(removed)
        })
        .ok()
        .flatten();
    removed.is_some()
}

/// The names of this thread's hooks, in registration (and call) order.
pub fn hook_names() -> Vec<String> {
    HOOKS.with(|h| h.borrow().iter().map(|(n, _)| n.clone()).collect())
}

/// The source location that called the malloc whose hooks are running on this thread
/// (`None` outside malloc hooks): [`alloc`](super::alloc),
/// [`Allocator::malloc`](super::Allocator::malloc) and
/// [`MemoryPool::malloc`](super::MemoryPool::malloc) are `#[track_caller]`, so this is
/// the user's line (or that of the caller of a `#[track_caller]` user function).
pub fn call_site() -> Option<&'static Location<'static>> {
    CALL_SITE.with(Cell::get)
}

/// Calls `f` on each hook of this thread, in order.
pub(crate) fn each(f: impl Fn(&dyn MemoryHook)) {
    let hooks = HOOKS.with(|h| Rc::clone(&h.borrow()));
    for (_, hook) in hooks.iter() {
        f(&**hook);
    }
}

/// Sets the call site for the malloc hooks that run until the guard drops.
pub(crate) fn enter_call_site(site: &'static Location<'static>) -> CallSiteGuard {
    CallSiteGuard(CALL_SITE.with(|c| c.replace(Some(site))))
}

/// Restores the previous call site (a hook may malloc from inside a hook).
pub(crate) struct CallSiteGuard(Option<&'static Location<'static>>);

impl Drop for CallSiteGuard {
    fn drop(&mut self) {
        CALL_SITE.with(|c| c.set(self.0));
    }
}

// ---------------------------------------------------------------------------------
// DebugPrintHook

/// Writes one JSON line per event, as CuPy's `DebugPrintHook` does (on the `_post`
/// callbacks: `alloc`, `malloc` and `free`), to a writer (default: stderr):
///
/// ```text
/// {"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":140241544249344}
/// {"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":140241544249344,"pmem_id":"0x5581c2a3f9e0"}
/// {"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":140241544249344,"pmem_id":"0x5581c2a3f9e0"}
/// ```
///
/// Write errors are ignored (a debugging aid must not fail the allocation). Each line
/// is one JSON object, written by serde_json straight to the writer.
#[cfg(feature = "serde")]
pub struct DebugPrintHook {
    out: RefCell<Box<dyn Write>>,
}

#[cfg(feature = "serde")]
impl std::fmt::Debug for DebugPrintHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugPrintHook").finish_non_exhaustive()
    }
}

#[cfg(feature = "serde")]
impl Default for DebugPrintHook {
    fn default() -> Self {
        Self::new()
    }
}

/// One line of [`DebugPrintHook`], in CuPy's key order.
#[cfg(feature = "serde")]
#[derive(serde::Serialize)]
struct DebugLine {
    hook: &'static str,
    device_id: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<usize>,
    mem_size: usize,
    mem_ptr: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pmem_id: Option<Hex>,
}

/// A number written as a JSON string in hex (`"0x5581c2a3f9e0"`), formatted straight
/// into the output.
#[cfg(feature = "serde")]
struct Hex(usize);

#[cfg(feature = "serde")]
impl serde::Serialize for Hex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:#x}", self.0))
    }
}

#[cfg(feature = "serde")]
impl DebugPrintHook {
    /// A hook that prints to stderr.
    pub fn new() -> Self {
        Self::with_writer(io::stderr())
    }

    /// A hook that prints to `out`.
    pub fn with_writer(out: impl Write + 'static) -> Self {
        DebugPrintHook {
            out: RefCell::new(Box::new(out)),
        }
    }

    fn line(&self, line: &DebugLine) {
        // A hook calling back into itself (it cannot: it allocates nothing) would find
        // the writer borrowed; skip the line rather than panic.
        if let Ok(mut out) = self.out.try_borrow_mut() {
            let _ = serde_json::to_writer(&mut *out, line);
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
    }
}

#[cfg(feature = "serde")]
impl MemoryHook for DebugPrintHook {
    fn alloc_post(&self, device: i32, mem_size: usize, mem_ptr: u64) {
        self.line(&DebugLine {
            hook: "alloc",
            device_id: device,
            size: None,
            mem_size,
            mem_ptr,
            pmem_id: None,
        });
    }

    fn malloc_post(&self, device: i32, size: usize, mem_size: usize, mem_ptr: u64, pmem_id: usize) {
        self.line(&DebugLine {
            hook: "malloc",
            device_id: device,
            size: Some(size),
            mem_size,
            mem_ptr,
            pmem_id: Some(Hex(pmem_id)),
        });
    }

    fn free_post(&self, device: i32, mem_size: usize, mem_ptr: u64, pmem_id: usize) {
        self.line(&DebugLine {
            hook: "free",
            device_id: device,
            size: None,
            mem_size,
            mem_ptr,
            pmem_id: Some(Hex(pmem_id)),
        });
    }
}

// ---------------------------------------------------------------------------------
// LineProfileHook

/// Bytes of one call site, as [`LineProfileHook::sites`] returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteBytes {
    /// The source file of the call site.
    pub file: &'static str,
    /// Its line.
    pub line: u32,
    /// Its column.
    pub column: u32,
    /// Bytes allocated there so far (rounded sizes, every malloc counted).
    pub allocated: u64,
    /// Of those, bytes still in use (not freed yet on this thread).
    pub in_use: u64,
    /// Bytes the pool newly took from the driver for mallocs at this site (CuPy's
    /// second figure per line: its `alloc` hooks); a malloc the cache served adds 0.
    pub acquired: u64,
}

type SiteKey = (&'static str, u32, u32);

#[derive(Default)]
struct Profile {
    /// Per call site: (allocated, in use, acquired from the driver).
    sites: BTreeMap<SiteKey, (u64, u64, u64)>,
    /// Live blocks seen at malloc: (device, pointer) -> (site, size).
    live: HashMap<(i32, u64), (SiteKey, u64)>,
}

/// Sums, per call site, the bytes allocated and the bytes still in use, and prints
/// them as a tree: the root, then one node per source file, then one per call site
/// (`file:line:column`), each with `(allocated, in use)`. Call sites come from
/// `#[track_caller]` (see [`call_site`]); a malloc with no known site counts under
/// `<unknown>`. Frees are matched to their malloc by device and address, on the thread
/// the hook is registered on.
#[derive(Default)]
pub struct LineProfileHook {
    state: RefCell<Profile>,
    /// Levels of the report's tree to print (0: all), as CuPy's `max_depth`.
    max_depth: usize,
}

impl std::fmt::Debug for LineProfileHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineProfileHook")
            .field("sites", &self.state.borrow().sites.len())
            .finish_non_exhaustive()
    }
}

impl LineProfileHook {
    /// An empty profile.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty profile whose report prints at most `max_depth` levels of the tree
    /// (1: the root; 2: the root and the files; 0 or 3 and more: everything), as
    /// CuPy's `LineProfileHook(max_depth=...)` limits its report.
    pub fn with_max_depth(max_depth: usize) -> Self {
        LineProfileHook {
            max_depth,
            ..Self::default()
        }
    }

    /// Every call site seen, sorted by file, line and column.
    pub fn sites(&self) -> Vec<SiteBytes> {
        self.state
            .borrow()
            .sites
            .iter()
            .map(
                |(&(file, line, column), &(allocated, in_use, acquired))| SiteBytes {
                    file,
                    line,
                    column,
                    allocated,
                    in_use,
                    acquired,
                },
            )
            .collect()
    }

    /// The tree as text, two spaces of indent per level (as deep as
    /// [`with_max_depth`](Self::with_max_depth) allows); `acquired` is CuPy's figure,
    /// the bytes newly taken from the driver:
    ///
    /// ```text
    /// _root (allocated 3.00 KiB, acquired 2.00 KiB, in use 1.00 KiB)
    ///   src/main.rs (allocated 3.00 KiB, acquired 2.00 KiB, in use 1.00 KiB)
    ///     src/main.rs:10:13 (allocated 2.00 KiB, acquired 2.00 KiB, in use 0 B)
    ///     src/main.rs:11:13 (allocated 1.00 KiB, acquired 0 B, in use 1.00 KiB)
    /// ```
    pub fn report(&self) -> String {
        let st = self.state.borrow();
        // file -> (allocated, in use, acquired, its sites)
        type FileNode = (u64, u64, u64, Vec<(SiteKey, (u64, u64, u64))>);
        let mut files: BTreeMap<&str, FileNode> = BTreeMap::new();
        let mut root = (0u64, 0u64, 0u64);
        for (&key, &(a, u, q)) in &st.sites {
            let f = files.entry(key.0).or_default();
            f.0 += a;
            f.1 += u;
            f.2 += q;
            f.3.push((key, (a, u, q)));
            root = (root.0 + a, root.1 + u, root.2 + q);
        }
        let node = |s: &mut String, indent: usize, label: &str, (a, u, q): (u64, u64, u64)| {
            let _ = writeln!(
                s,
                "{:indent$}{label} (allocated {}, acquired {}, in use {})",
                "",
                human_bytes(a),
                human_bytes(q),
                human_bytes(u)
            );
        };
        let shows = |level: usize| self.max_depth == 0 || level <= self.max_depth;
        let mut s = String::new();
        node(&mut s, 0, "_root", root);
        for (file, (a, u, q, sites)) in &files {
            if !shows(2) {
                break;
            }
            node(&mut s, 2, file, (*a, *u, *q));
            for ((file, line, col), bytes) in sites {
                if shows(3) {
                    node(&mut s, 4, &format!("{file}:{line}:{col}"), *bytes);
                }
            }
        }
        s
    }

    /// Writes [`report`](Self::report) to `out`.
    pub fn print_report(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.report().as_bytes())
    }
}

impl MemoryHook for LineProfileHook {
    fn alloc_post(&self, _device: i32, mem_size: usize, _mem_ptr: u64) {
        let key = call_site().map_or(("<unknown>", 0, 0), |l| (l.file(), l.line(), l.column()));
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return;
        };
        st.sites.entry(key).or_default().2 += mem_size as u64;
    }

    fn malloc_post(&self, device: i32, _size: usize, mem_size: usize, mem_ptr: u64, _id: usize) {
        let key = call_site().map_or(("<unknown>", 0, 0), |l| (l.file(), l.line(), l.column()));
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return;
        };
        let e = st.sites.entry(key).or_default();
        e.0 += mem_size as u64;
        e.1 += mem_size as u64;
        st.live.insert((device, mem_ptr), (key, mem_size as u64));
    }

    fn free_post(&self, device: i32, _mem_size: usize, mem_ptr: u64, _id: usize) {
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return;
        };
        if let Some((key, size)) = st.live.remove(&(device, mem_ptr)) {
            if let Some(e) = st.sites.get_mut(&key) {
                e.1 = e.1.saturating_sub(size);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nop;
    impl MemoryHook for Nop {}

    #[test]
    fn duplicate_hook_name_is_an_error_and_the_guard_unregisters() {
        assert!(!has_hooks());
        let g = register_hook("a", Rc::new(Nop)).unwrap();
        assert!(has_hooks());
        let e = register_hook("a", Rc::new(Nop)).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                kind: crate::error::ArgumentKind::AlreadyExists,
                ..
            }
        ));
        assert!(e.to_string().contains("\"a\" is already registered"), "{e}");
        let g2 = register_hook("b", Rc::new(Nop)).unwrap();
        assert_eq!(hook_names(), ["a", "b"]);
        drop(g);
        assert_eq!(hook_names(), ["b"]);
        assert!(has_hooks());
        drop(g2);
        assert!(!has_hooks());
        // The name is free again.
        let _g = register_hook("a", Rc::new(Nop)).unwrap();
    }

    #[test]
    fn a_hook_whose_drop_uses_the_registry_is_dropped_outside_it() {
        // Owns another hook's guard, and asks for the names when it goes.
        struct Composite(std::cell::RefCell<Option<HookGuard>>);
        impl MemoryHook for Composite {}
        impl Drop for Composite {
            fn drop(&mut self) {
                let _ = hook_names();
                drop(self.0.borrow_mut().take());
            }
        }
        let inner = register_hook("inner", Rc::new(Nop)).unwrap();
        let outer = register_hook(
            "outer",
            Rc::new(Composite(std::cell::RefCell::new(Some(inner)))),
        )
        .unwrap();
        assert_eq!(hook_names(), ["inner", "outer"]);
        drop(outer);
        assert!(
            hook_names().is_empty(),
            "the inner guard went with the outer hook"
        );
        assert!(!has_hooks());
    }

    #[test]
    fn hooks_are_per_thread() {
        let _g = register_hook("mine", Rc::new(Nop)).unwrap();
        std::thread::spawn(|| {
            assert!(!has_hooks());
            // The same name is free on another thread.
            let _g = register_hook("mine", Rc::new(Nop)).unwrap();
        })
        .join()
        .unwrap();
        assert!(has_hooks());
    }

    /// A `Write` into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(Rc<RefCell<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn debug_print_hook_writes_one_json_line_per_event() {
        let buf = Buf::default();
        let h = DebugPrintHook::with_writer(buf.clone());
        h.malloc_pre(0, 1000, 1024);
        h.alloc_pre(0, 1024);
        h.alloc_post(0, 1024, 4096);
        h.malloc_post(0, 1000, 1024, 4096, 0xabc);
        h.free_pre(0, 1024, 4096, 0xabc);
        h.free_post(0, 1024, 4096, 0xabc);
        let text = String::from_utf8(buf.0.borrow().clone()).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":4096}"#,
                "\n",
                r#"{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":4096,"pmem_id":"0xabc"}"#,
                "\n",
                r#"{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":4096,"pmem_id":"0xabc"}"#,
                "\n",
            )
        );
    }

    #[test]
    fn line_profile_hook_prints_a_tree_of_allocated_and_in_use_bytes() {
        let h = LineProfileHook::new();
        // Two sites: one line allocating twice (one freed), another once.
        let site_a = Location::caller();
        {
            // The first malloc took a new segment from the driver; the second was cached.
            let _c = enter_call_site(site_a);
            h.alloc_post(0, 1024, 0x1000);
            h.malloc_post(0, 1000, 1024, 0x1000, 1);
            h.malloc_post(0, 1000, 1024, 0x2000, 2);
        }
        let site_b = Location::caller();
        {
            let _c = enter_call_site(site_b);
            h.malloc_post(0, 100, 512, 0x3000, 3);
        }
        h.free_post(0, 1024, 0x1000, 1);
        h.free_post(0, 512, 0x9999, 9); // unknown: ignored
        assert_eq!(call_site(), None, "restored after each malloc");
        let sites = h.sites();
        assert_eq!(sites.len(), 2);
        assert_eq!(
            (sites[0].allocated, sites[0].in_use, sites[0].acquired),
            (2048, 1024, 1024)
        );
        assert_eq!(
            (sites[1].allocated, sites[1].in_use, sites[1].acquired),
            (512, 512, 0)
        );
        let f = site_a.file();
        let expected = format!(
            "_root (allocated 2.50 KiB, acquired 1.00 KiB, in use 1.50 KiB)\n\
             \x20 {f} (allocated 2.50 KiB, acquired 1.00 KiB, in use 1.50 KiB)\n\
             \x20   {f}:{}:{} (allocated 2.00 KiB, acquired 1.00 KiB, in use 1.00 KiB)\n\
             \x20   {f}:{}:{} (allocated 512 B, acquired 0 B, in use 512 B)\n",
            site_a.line(),
            site_a.column(),
            site_b.line(),
            site_b.column(),
        );
        assert_eq!(h.report(), expected);
        // CuPy's max_depth: the root only, then the root and the files.
        let shallow = LineProfileHook::with_max_depth(1);
        {
            let _c = enter_call_site(site_a);
            shallow.malloc_post(0, 10, 512, 0x5000, 5);
        }
        assert_eq!(shallow.report().lines().count(), 1);
        let files = LineProfileHook::with_max_depth(2);
        {
            let _c = enter_call_site(site_a);
            files.malloc_post(0, 10, 512, 0x5000, 5);
        }
        assert_eq!(files.report().lines().count(), 2);
    }

    #[test]
    fn a_hook_may_register_another_hook_while_running() {
        struct Registrar(RefCell<Option<HookGuard>>);
        impl MemoryHook for Registrar {
            fn malloc_pre(&self, _: i32, _: usize, _: usize) {
                *self.0.borrow_mut() = Some(register_hook("inner", Rc::new(Nop)).unwrap());
            }
        }
        let r = Rc::new(Registrar(RefCell::new(None)));
        let _g = register_hook("outer", r.clone()).unwrap();
        each(|h| h.malloc_pre(0, 1, 512));
        assert_eq!(hook_names(), ["outer", "inner"]);
        r.0.borrow_mut().take();
        assert_eq!(hook_names(), ["outer"]);
    }
}
