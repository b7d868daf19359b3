//! Memory hooks: callbacks around the caching pool's mallocs and frees on this thread.
//! A hook of our own that tracks bytes (the spec's `MemoryTracker`), the built-in
//! debug-print hook (one JSON line per event) and the line-profile hook (bytes per call
//! site) (the spec's "Memory Hooks").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 08_hooks`. Without a GPU it prints why
//! and exits 0.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::rc::Rc;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::memory::hook::{self, DebugPrintHook, LineProfileHook, MemoryHook};
use cuda_rt::MemoryPool;

fn main() {
    if let Err(reason) = cuda_rt::availability() {
        println!("skipped: no GPU: {reason}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Bytes allocated and freed through the pool (sizes rounded up to 512, as the pool
/// hands them out). Hooks belong to one thread, so `Cell` is enough.
#[derive(Default)]
struct Tracker {
    allocated: Cell<usize>,
    freed: Cell<usize>,
}

impl MemoryHook for Tracker {
    fn malloc_post(&self, _dev: i32, _size: usize, mem_size: usize, _ptr: u64, _id: usize) {
        self.allocated.set(self.allocated.get() + mem_size);
    }
    fn free_pre(&self, _dev: i32, mem_size: usize, _ptr: u64, _id: usize) {
        self.freed.set(self.freed.get() + mem_size);
    }
}

/// A writer we can read back (the debug-print hook writes to stderr by default).
#[derive(Clone, Default)]
struct Captured(Rc<RefCell<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn run() -> cuda_rt::Result<()> {
    let tracker = Rc::new(Tracker::default());
    {
        // Registered until the guard drops; names are unique per thread.
        let _guard = hook::register_hook("tracker", tracker.clone())?;
        let a = DeviceBuffer::<f32>::zeros(1000)?; // 4000 bytes: a 4096-byte block
        let b = DeviceBuffer::<u8>::from_slice(&[1; 100])?; // a 512-byte block
        assert_eq!(tracker.allocated.get(), 4096 + 512);
        drop((a, b));
        assert_eq!(tracker.freed.get(), 4096 + 512);
        assert_eq!(hook::hook_names(), ["tracker"]);
    }
    let _unseen = DeviceBuffer::<f32>::zeros(1000)?; // no hook any more
    assert_eq!(tracker.allocated.get(), 4096 + 512);
    println!(
        "tracker: {} B allocated, {} B freed",
        tracker.allocated.get(),
        tracker.freed.get()
    );

    // CuPy's debug-print hook: `alloc` when the pool asks the driver for memory, then
    // `malloc`, and `free` when the memory goes back to the pool.
    let out = Captured::default();
    {
        let _guard =
            hook::register_hook("debug", Rc::new(DebugPrintHook::with_writer(out.clone())))?;
        let fresh = MemoryPool::new(); // empty, so the first malloc reaches the driver
        drop(fresh.malloc(1000)?);
    }
    let text = String::from_utf8_lossy(&out.0.borrow()).into_owned();
    print!("{text}");
    let events: Vec<&str> = text.lines().filter_map(|l| l.split('"').nth(3)).collect();
    assert_eq!(events, ["alloc", "malloc", "free"]);

    // The line-profile hook: bytes allocated, and still in use, per line of code.
    let profile = Rc::new(LineProfileHook::new());
    let kept = {
        let _guard = hook::register_hook("profile", profile.clone())?;
        let kept = DeviceBuffer::<u8>::zeros(1 << 20)?; // 1 MiB, still in use
        for _ in 0..3 {
            drop(cuda_rt::alloc(4096)?); // 3 x 4 KiB, all freed (untyped, the same)
        }
        kept
    };
    print!("{}", profile.report());
    let sites = profile.sites();
    assert!(sites.iter().all(|s| s.file == file!()), "{sites:?}");
    let bytes: Vec<_> = sites.iter().map(|s| (s.allocated, s.in_use)).collect();
    assert_eq!(bytes, [(1 << 20, 1 << 20), (3 * 4096, 0)]);
    drop(kept);
    println!("ok");
    Ok(())
}
