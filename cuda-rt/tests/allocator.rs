//! Allocator selection: process-wide and scoped allocators, closures and C functions.
//! Most tests run without a GPU: their allocators hand out fake addresses that are
//! never accessed.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cuda_rt::memory::{
    self, alloc, get_allocator, set_allocator, using_allocator, Allocate, Allocator, CAllocator,
    ClosureAllocator, MemoryPointer,
};
use cuda_rt::{ArgumentKind, Error, StateKind};

/// The process-wide allocator is shared by every test in this binary.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A closure allocator that counts and hands out fake addresses (never accessed).
fn counting() -> (Allocator, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let mallocs = Arc::new(AtomicUsize::new(0));
    let frees = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicU64::new(0x10_0000));
    let (m, f) = (mallocs.clone(), frees.clone());
    // SAFETY: the addresses are never used for a copy or memset in these tests.
    let a = unsafe {
        ClosureAllocator::new(
            move |size, _dev| {
                m.fetch_add(1, Ordering::SeqCst);
                Ok(next.fetch_add(size as u64, Ordering::SeqCst))
            },
            move |_ptr, _size, _dev| {
                f.fetch_add(1, Ordering::SeqCst);
            },
        )
    };
    (Allocator::Closures(a), mallocs, frees)
}

/// Whether `a` is the default pool.
fn is_default_pool(a: &Allocator) -> bool {
    a.same_as(&Allocator::Pool(memory::get_default_memory_pool()))
}

#[test]
fn default_allocator_is_the_default_memory_pool_until_set() {
    let _g = serial();
    // Another test of this binary may have set the process-wide allocator already
    // (the untouched default is checked by the library's unit test
    // `the_process_wide_default_is_the_default_pool`).
    let fresh = std::thread::spawn(get_allocator).join().unwrap();
    assert!(
        is_default_pool(&fresh) || matches!(fresh, Allocator::Device),
        "{fresh:?}"
    );
    set_allocator(Some(Allocator::Pool(memory::get_default_memory_pool()))).unwrap();
    assert!(is_default_pool(&get_allocator()));
    set_allocator(None).unwrap();
    assert!(
        matches!(get_allocator(), Allocator::Device),
        "None is plain device memory"
    );
}

#[test]
fn a_memory_pool_is_an_allocator_equal_to_itself_only() {
    let a = Allocator::Pool(memory::MemoryPool::new());
    let b = Allocator::Pool(memory::MemoryPool::new());
    assert!(a.same_as(&a.clone()));
    assert!(!a.same_as(&b));
    assert!(!a.same_as(&Allocator::Device));
    assert!(is_default_pool(&Allocator::Pool(
        memory::get_default_memory_pool()
    )));
}

#[test]
fn closure_allocator_is_used_and_frees_on_drop() {
    let _g = serial();
    let (a, mallocs, frees) = counting();
    set_allocator(Some(a.clone())).unwrap();
    assert!(get_allocator().same_as(&a));
    let p = alloc(1000).unwrap();
    assert_eq!(p.size(), 1000);
    assert_eq!(p.ptr(), 0x10_0000);
    assert_eq!(mallocs.load(Ordering::SeqCst), 1);
    let q = p.checked_add(10).unwrap();
    drop(p);
    assert_eq!(
        frees.load(Ordering::SeqCst),
        0,
        "a pointer into it keeps it alive"
    );
    drop(q);
    assert_eq!(frees.load(Ordering::SeqCst), 1);
    set_allocator(None).unwrap();
    assert!(matches!(get_allocator(), Allocator::Device));
}

#[test]
fn alloc_of_zero_bytes_is_null_and_calls_no_allocator() {
    let _g = serial();
    let (a, mallocs, frees) = counting();
    using_allocator(Some(a), || {
        let p = alloc(0).unwrap();
        assert_eq!((p.ptr(), p.size()), (0, 0));
    });
    assert_eq!(mallocs.load(Ordering::SeqCst), 0);
    assert_eq!(frees.load(Ordering::SeqCst), 0);
}

#[test]
fn using_allocator_nests_and_restores() {
    let _g = serial();
    let before = get_allocator();
    let (a, ma, _) = counting();
    let (b, mb, _) = counting();
    using_allocator(Some(a.clone()), || {
        assert!(get_allocator().same_as(&a));
        using_allocator(Some(b.clone()), || {
            assert!(get_allocator().same_as(&b));
            let _p = alloc(8).unwrap();
        });
        assert!(get_allocator().same_as(&a));
        let _p = alloc(8).unwrap();
    });
    assert!(get_allocator().same_as(&before));
    assert_eq!(ma.load(Ordering::SeqCst), 1);
    assert_eq!(mb.load(Ordering::SeqCst), 1);
}

#[test]
fn using_allocator_restores_after_a_panic() {
    let _g = serial();
    let before = get_allocator();
    let (a, _, _) = counting();
    let a = std::panic::AssertUnwindSafe(a);
    let r = std::panic::catch_unwind(move || {
        let a = a;
        using_allocator(Some(a.0), || panic!("inside the scope"))
    });
    assert!(r.is_err());
    assert!(get_allocator().same_as(&before));
    set_allocator(None).unwrap(); // not inside a scope any more
}

#[test]
fn set_allocator_inside_a_scope_is_an_error() {
    let _g = serial();
    let (a, _, _) = counting();
    using_allocator(Some(a), || {
        let e = set_allocator(None).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidState {
                kind: StateKind::Reentrant,
                ..
            }
        ));
        assert!(e.to_string().contains("using_allocator"), "{e}");
    });
    set_allocator(None).unwrap();
}

#[test]
fn memory_from_a_scope_stays_valid_after_it() {
    let _g = serial();
    let before = get_allocator();
    let (a, _, frees) = counting();
    let p = using_allocator(Some(a), || alloc(64).unwrap());
    assert!(get_allocator().same_as(&before));
    assert_eq!(p.size(), 64);
    assert_eq!(frees.load(Ordering::SeqCst), 0);
    drop(p);
    assert_eq!(
        frees.load(Ordering::SeqCst),
        1,
        "freed by the allocator that made it"
    );
}

#[test]
fn scoped_allocator_is_per_thread() {
    let _g = serial();
    let before = get_allocator();
    let (a, _, _) = counting();
    using_allocator(Some(a.clone()), || {
        let b = before.clone();
        let other = std::thread::spawn(move || get_allocator().same_as(&b));
        assert!(other.join().unwrap());
        assert!(get_allocator().same_as(&a));
    });
}

#[test]
fn process_wide_allocator_reaches_other_threads() {
    let _g = serial();
    let (a, mallocs, _) = counting();
    // The other thread caches the current one first, then must see the new one.
    let before = get_allocator();
    std::thread::spawn(move || assert!(get_allocator().same_as(&before)))
        .join()
        .unwrap();
    set_allocator(Some(a)).unwrap();
    std::thread::spawn(|| {
        let _p = alloc(16).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(mallocs.load(Ordering::SeqCst), 1);
    set_allocator(None).unwrap();
}

#[test]
fn closure_allocator_errors_pass_through() {
    let _g = serial();
    // SAFETY: malloc never succeeds, so no address is ever used.
    let a = unsafe {
        ClosureAllocator::new(
            |size, _| {
                Err(Error::invalid_argument(
                    ArgumentKind::Other,
                    format!("refusing {size}"),
                ))
            },
            |_, _, _| {},
        )
    };
    let e = using_allocator(Some(Allocator::Closures(a)), || alloc(5).unwrap_err());
    assert_eq!(e.to_string(), "invalid argument: refusing 5");
}

static C_LIVE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn c_malloc(ctx: *mut c_void, size: usize, device: i32) -> u64 {
    assert_eq!(ctx as usize, 0xC0DE);
    assert!(device >= 0);
    if size > 1 << 20 {
        return 0;
    }
    C_LIVE.fetch_add(1, Ordering::SeqCst);
    0x4000_0000
}

extern "C" fn c_free(ctx: *mut c_void, ptr: u64, _device: i32) {
    assert_eq!(ctx as usize, 0xC0DE);
    assert_eq!(ptr, 0x4000_0000);
    C_LIVE.fetch_sub(1, Ordering::SeqCst);
}

#[test]
fn c_function_allocator_passes_its_argument_and_frees() {
    let _g = serial();
    // SAFETY: the functions are thread-safe; the fake address is never accessed.
    let a = unsafe { CAllocator::new(c_malloc, c_free, 0xC0DE as *mut c_void) };
    let p = using_allocator(Some(Allocator::C(a)), || alloc(100).unwrap());
    assert_eq!(p.ptr(), 0x4000_0000);
    assert_eq!(C_LIVE.load(Ordering::SeqCst), 1);
    drop(p);
    assert_eq!(C_LIVE.load(Ordering::SeqCst), 0);
    let e = using_allocator(Some(Allocator::C(a)), || alloc(2 << 20).unwrap_err());
    assert!(e.to_string().contains("C allocator failed"), "{e}");
}

struct Fixed;
impl Allocate for Fixed {
    fn malloc(&self, size: usize, device: i32) -> cuda_rt::Result<MemoryPointer> {
        Err(Error::invalid_argument(
            ArgumentKind::Other,
            format!("Fixed asked for {size} on {device}"),
        ))
    }
}

#[test]
fn custom_allocate_trait_is_called() {
    let _g = serial();
    let e = using_allocator(Some(Allocator::Custom(Arc::new(Fixed))), || {
        alloc(7).unwrap_err()
    });
    assert!(e.to_string().contains("Fixed asked for 7"), "{e}");
}

cuda_rt::gpu_test!(device_allocator_round_trips_data, {
    let _g = serial();
    using_allocator(None, || {
        let p = alloc(4096).unwrap();
        let src: Vec<u32> = (0..1024).collect();
        p.copy_from_host(&src).unwrap();
        let mut back = vec![0u32; 1024];
        p.copy_to_host(&mut back).unwrap();
        assert_eq!(back, src);
    });
});

cuda_rt::gpu_test!(async_pool_as_the_allocator, {
    let _g = serial();
    let pool = memory::MemoryAsyncPool::new().unwrap();
    using_allocator(Some(Allocator::Async(pool.clone())), || {
        let p = alloc(1000).unwrap();
        assert_eq!(p.size(), 1024, "rounded to 512");
        p.copy_from_host(&[7u8; 1000]).unwrap();
        let mut back = [0u8; 1000];
        p.copy_to_host(&mut back).unwrap();
        assert_eq!(back, [7u8; 1000]);
    });
});
