//! The pool algorithm (`memory::arena`) against CuPy's semantics, on host backends.
//! Miri-friendly: loops shrink under `cfg(miri)`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cuda_rt::cuda_sys::driver::CUresult;
use cuda_rt::error::DriverError;
use cuda_rt::memory::arena::{
    limit_from_fraction, parse_limit, round_size, Backend, BackendError, Block, FakeBackend,
    FreeError, HostBackend, MallocError, Pool, PoolStats, SegmentSpec, StreamFence,
    ALLOCATION_UNIT,
};
use cuda_rt::{OutOfMemory, OutOfMemoryCause};

const KIB: usize = 1024;

fn fake_pool() -> (Arc<FakeBackend>, Pool<Arc<FakeBackend>>) {
    let backend = Arc::new(FakeBackend::checked());
    (backend.clone(), Pool::new(backend))
}

/// CuPy's identity, the internal invariants, and reserved == what the backend holds.
fn assert_consistent(pool: &Pool<Arc<FakeBackend>>, backend: &FakeBackend) -> PoolStats {
    let s = pool.stats();
    assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes, "{s:?}");
    assert_eq!(s.total_bytes, backend.counters().live_bytes, "{s:?}");
    assert_eq!(
        backend.counters().bad_frees,
        0,
        "the pool freed what it did not own"
    );
    pool.check().unwrap();
    s
}

fn oom(r: Result<Block, MallocError>) -> OutOfMemory {
    match r {
        Err(MallocError::OutOfMemory(e)) => *e,
        other => panic!("expected out of memory, got {other:?}"),
    }
}

#[test]
fn sizes_round_up_to_512_bytes() {
    assert_eq!(ALLOCATION_UNIT, 512);
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(usize::MAX), None);
    let (backend, pool) = fake_pool();
    let a = pool.malloc(1, 0).unwrap();
    let b = pool.malloc(513, 0).unwrap();
    assert_eq!((a.size(), b.size()), (512, 1024));
    assert_eq!(pool.used_bytes(), 1536);
    assert_eq!(backend.counters().live_bytes, 1536);
    pool.free(a).unwrap();
    pool.free(b).unwrap();
    assert_consistent(&pool, &backend);
}

#[test]
fn huge_request_that_overflows_rounding_is_out_of_memory() {
    let (_, pool) = fake_pool();
    let e = oom(pool.malloc(usize::MAX, 0));
    assert_eq!((e.requested, e.rounded), (usize::MAX as u64, None));
    assert_eq!(e.cause, OutOfMemoryCause::Backend);
}

#[test]
fn malloc_zero_returns_an_unpooled_null_block() {
    let (backend, pool) = fake_pool();
    let b = pool.malloc(0, 3).unwrap();
    assert!(b.is_null());
    assert_eq!((b.addr(), b.size()), (0, 0));
    pool.free(b).unwrap();
    assert_eq!(pool.stats(), PoolStats::default());
    assert_eq!(backend.counters().allocs, 0);
}

#[test]
fn larger_free_chunk_is_split_and_caller_gets_the_lower_part() {
    let (backend, pool) = fake_pool();
    let big = pool.malloc(4 * KIB, 0).unwrap();
    let base = big.addr();
    pool.free(big).unwrap();
    let small = pool.malloc(KIB, 0).unwrap();
    assert_eq!(small.addr(), base);
    assert_eq!(pool.free_chunks(0), vec![(base + 1024, 3072)]);
    assert_eq!(backend.counters().allocs, 1);
    let s = assert_consistent(&pool, &backend);
    assert_eq!(
        (s.used_bytes, s.free_bytes, s.n_free_blocks),
        (1024, 3072, 1)
    );
    pool.free(small).unwrap();
}

#[test]
fn best_fit_takes_the_smallest_large_enough_chunk_then_the_lowest_address() {
    let (backend, pool) = fake_pool();
    let a = pool.malloc(4 * KIB, 0).unwrap();
    let b = pool.malloc(2 * KIB, 0).unwrap();
    let c = pool.malloc(2 * KIB, 0).unwrap();
    let d = pool.malloc(KIB, 0).unwrap();
    let (b_addr, c_addr) = (b.addr(), c.addr());
    assert!(b_addr < c_addr);
    for x in [c, a, d, b] {
        pool.free(x).unwrap();
    }
    let got = pool.malloc(1536, 0).unwrap();
    assert_eq!(
        got.addr(),
        b_addr,
        "2 KiB beats 4 KiB; the lower of two 2 KiB chunks wins"
    );
    let next = pool.malloc(1536, 0).unwrap();
    assert_eq!(next.addr(), c_addr);
    pool.free(got).unwrap();
    pool.free(next).unwrap();
    assert_consistent(&pool, &backend);
}

#[test]
fn free_merges_neighbours_of_the_same_allocation_in_any_order() {
    let orders: [[usize; 3]; 6] = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for order in orders {
        let (backend, pool) = fake_pool();
        let whole = pool.malloc(4 * KIB, 0).unwrap();
        let base = whole.addr();
        pool.free(whole).unwrap();
        let mut parts: Vec<Option<Block>> = [KIB, KIB, 2 * KIB]
            .iter()
            .map(|&s| Some(pool.malloc(s, 0).unwrap()))
            .collect();
        assert_eq!(pool.n_free_blocks(), 0);
        for &i in &order {
            pool.free(parts[i].take().unwrap()).unwrap();
            assert_consistent(&pool, &backend);
        }
        assert_eq!(pool.free_chunks(0), vec![(base, 4096)], "order {order:?}");
        assert_eq!(backend.counters().allocs, 1);
    }
}

#[test]
fn chunks_of_different_allocations_never_merge() {
    let (backend, pool) = fake_pool();
    let a = pool.malloc(KIB, 0).unwrap();
    let b = pool.malloc(KIB, 0).unwrap();
    pool.free(a).unwrap();
    pool.free(b).unwrap();
    // The fake backend hands out adjacent ranges, yet they stay two chunks.
    assert_eq!(pool.n_free_blocks(), 2);
    assert_consistent(&pool, &backend);
}

#[test]
fn free_then_malloc_same_size_reuses_the_pointer() {
    let (backend, pool) = fake_pool();
    for size in [256, 1 << 20, 64 << 20] {
        let a = pool.malloc(size, 5).unwrap();
        let addr = a.addr();
        pool.free(a).unwrap();
        let b = pool.malloc(size, 5).unwrap();
        assert_eq!(b.addr(), addr);
        pool.free(b).unwrap();
    }
    let s = assert_consistent(&pool, &backend);
    assert_eq!((s.cache_hits, s.cache_misses, s.backend_allocs), (3, 3, 3));
}

#[test]
fn a_chunk_goes_back_to_its_own_arena_and_other_arenas_do_not_see_it() {
    let (backend, pool) = fake_pool();
    let a = pool.malloc(8 * KIB, 1).unwrap();
    assert_eq!(a.stream_key(), 1);
    let addr = a.addr();
    pool.free(a).unwrap();
    assert_eq!(pool.free_chunks(1), vec![(addr, 8192)]);
    assert!(pool.free_chunks(2).is_empty());
    let b = pool.malloc(8 * KIB, 2).unwrap();
    assert_ne!(b.addr(), addr, "arena 2 must not take arena 1's chunk");
    assert_eq!(backend.counters().allocs, 2);
    let c = pool.malloc(8 * KIB, 1).unwrap();
    assert_eq!(c.addr(), addr);
    pool.free(b).unwrap();
    pool.free(c).unwrap();
    let s = assert_consistent(&pool, &backend);
    assert_eq!(s.n_arenas, 2);
}

#[test]
fn free_all_blocks_releases_whole_chunks_and_keeps_split_pieces() {
    let (backend, pool) = fake_pool();
    let split_me = pool.malloc(4 * KIB, 0).unwrap();
    let base = split_me.addr();
    pool.free(split_me).unwrap();
    let live = pool.malloc(KIB, 0).unwrap();
    pool.free(pool.malloc(8 * KIB, 0).unwrap()).unwrap();
    assert_eq!(pool.total_bytes(), 12 * 1024);
    pool.free_all_blocks(None);
    let s = assert_consistent(&pool, &backend);
    assert_eq!(pool.free_chunks(0), vec![(base + 1024, 3072)]);
    assert_eq!(
        (s.total_bytes, s.used_bytes, s.n_free_blocks),
        (4096, 1024, 1)
    );
    assert_eq!(s.backend_frees, 1);
    pool.free(live).unwrap();
    pool.free_all_blocks(None);
    assert_eq!(assert_consistent(&pool, &backend).total_bytes, 0);
}

#[test]
fn free_all_blocks_with_a_key_touches_only_that_arena() {
    let (backend, pool) = fake_pool();
    pool.free(pool.malloc(KIB, 1).unwrap()).unwrap();
    pool.free(pool.malloc(KIB, 2).unwrap()).unwrap();
    pool.free_all_blocks(Some(1));
    assert!(pool.free_chunks(1).is_empty());
    assert_eq!(pool.free_chunks(2).len(), 1);
    pool.free_all_blocks(Some(99)); // unknown key: nothing, no arena created
    let s = assert_consistent(&pool, &backend);
    assert_eq!((s.total_bytes, s.n_arenas), (1024, 2));
}

#[test]
fn over_the_limit_the_cache_is_released_and_the_malloc_succeeds() {
    let (backend, pool) = fake_pool();
    pool.set_limit(8 * KIB as u64);
    assert_eq!(pool.limit(), 8192);
    pool.free(pool.malloc(4 * KIB, 0).unwrap()).unwrap();
    let b = pool.malloc(8 * KIB, 1).unwrap();
    let s = assert_consistent(&pool, &backend);
    assert_eq!(
        (s.oom_retries, s.backend_frees, s.total_bytes),
        (1, 1, 8192)
    );
    pool.free(b).unwrap();
}

#[test]
fn over_the_limit_with_nothing_releasable_fails_with_the_numbers() {
    let (backend, pool) = fake_pool();
    pool.set_limit(8 * KIB as u64);
    pool.free(pool.malloc(8 * KIB, 0).unwrap()).unwrap();
    let live = pool.malloc(KIB, 0).unwrap(); // split: 7 KiB cached, not releasable
    let e = oom(pool.malloc(8000, 0));
    assert_eq!(
        e,
        OutOfMemory {
            requested: 8000,
            rounded: Some(8192),
            device: None,
            in_use: 1024,
            cached: 7168,
            limit: Some(8192),
            cause: OutOfMemoryCause::Limit,
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("8.00 KiB") && msg.contains("limit"), "{msg}");
    let s = assert_consistent(&pool, &backend);
    assert_eq!((s.oom_retries, s.cache_misses), (1, 2));
    // Raising the limit makes the same request succeed.
    pool.set_limit(0);
    pool.free(pool.malloc(8000, 0).unwrap()).unwrap();
    pool.free(live).unwrap();
}

#[test]
fn backend_out_of_memory_releases_the_cache_and_retries_once() {
    let (backend, pool) = fake_pool();
    backend.set_capacity(8 * KIB as u64);
    pool.free(pool.malloc(8 * KIB, 1).unwrap()).unwrap();
    // Arena 2 cannot use arena 1's chunk; the backend is full until the release.
    let b = pool.malloc(4 * KIB, 2).unwrap();
    let s = assert_consistent(&pool, &backend);
    assert_eq!(
        (s.oom_retries, s.backend_frees, s.backend_allocs),
        (1, 1, 2)
    );
    assert_eq!(backend.counters().oom_refusals, 1);
    // Now nothing is cached: one refusal, one release, one more refusal, error.
    let e = oom(pool.malloc(8 * KIB, 2));
    assert_eq!(e.cause, OutOfMemoryCause::Backend);
    assert_eq!((e.in_use, e.cached, e.limit), (4096, 0, None));
    assert_eq!(backend.counters().oom_refusals, 3);
    assert_eq!(pool.stats().oom_retries, 2);
    pool.free(b).unwrap();
    assert_consistent(&pool, &backend);
}

#[test]
fn other_backend_failures_are_returned_without_retry() {
    let (backend, pool) = fake_pool();
    backend.set_fail_other(true);
    match pool.malloc(KIB, 0) {
        Err(MallocError::Backend(e)) => assert!(e.to_string().contains("injected")),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(pool.stats().oom_retries, 0);
    backend.set_fail_other(false);
    pool.free(pool.malloc(KIB, 0).unwrap()).unwrap();
    assert_consistent(&pool, &backend);
}

#[test]
fn the_driver_error_of_a_refusing_backend_is_in_the_out_of_memory_error() {
    const DRIVER: DriverError = DriverError {
        call: "cuMemAlloc",
        code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        name: "CUDA_ERROR_OUT_OF_MEMORY",
        description: "out of memory",
    };
    /// A backend over a full device: every allocation is refused by "the driver".
    struct Full;
    impl Backend for Full {
        fn alloc(&self, _size: usize) -> Result<u64, BackendError> {
            Err(BackendError::OutOfMemory(Some(DRIVER)))
        }
        fn free(&self, _addr: u64, _size: usize) {}
    }
    let pool = Pool::new(Full);
    let e = oom(pool.malloc(1000, 0));
    assert_eq!(e.cause, OutOfMemoryCause::Driver(DRIVER));
    assert_eq!((e.requested, e.rounded, e.device), (1000, Some(1024), None));
    assert_eq!(pool.stats().oom_retries, 1, "released and retried once");
    let msg = e.to_string();
    assert!(
        msg.ends_with("(cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory)"),
        "{msg}"
    );
}

#[test]
fn peaks_follow_maxima_and_reset_to_current_values() {
    let (backend, pool) = fake_pool();
    let a = pool.malloc(4 * KIB, 0).unwrap();
    let b = pool.malloc(8 * KIB, 0).unwrap();
    pool.free(a).unwrap();
    pool.free(b).unwrap();
    let s = assert_consistent(&pool, &backend);
    assert_eq!((s.peak_used_bytes, s.peak_total_bytes), (12288, 12288));
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!((s.peak_used_bytes, s.peak_total_bytes), (0, 12288));
    pool.free_all_blocks(None);
    assert_eq!(pool.stats().peak_total_bytes, 12288);
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!((s.peak_used_bytes, s.peak_total_bytes), (0, 0));
}

#[test]
fn hits_misses_and_backend_calls_are_counted() {
    let (backend, pool) = fake_pool();
    let a = pool.malloc(KIB, 0).unwrap(); // miss
    pool.free(a).unwrap();
    let b = pool.malloc(KIB, 0).unwrap(); // hit
    let c = pool.malloc(512, 0).unwrap(); // miss
    pool.free(b).unwrap();
    pool.free(c).unwrap();
    pool.free_all_blocks(None);
    let s = assert_consistent(&pool, &backend);
    assert_eq!(
        (
            s.mallocs,
            s.frees,
            s.cache_hits,
            s.cache_misses,
            s.backend_allocs,
            s.backend_frees
        ),
        (3, 3, 1, 2, 2, 2)
    );
    assert_eq!(backend.counters().allocs, 2);
}

#[test]
fn release_on_miss_gives_back_smaller_whole_chunks_before_growing() {
    let (backend, pool) = fake_pool();
    pool.set_release_on_miss(true);
    pool.free(pool.malloc(KIB, 0).unwrap()).unwrap();
    pool.free(pool.malloc(4 * KIB, 0).unwrap()).unwrap(); // miss; 1 KiB chunk released first
    assert_eq!(pool.free_chunks(0).len(), 1);
    let s = assert_consistent(&pool, &backend);
    assert_eq!((s.total_bytes, s.backend_frees), (4096, 1));
    pool.set_release_on_miss(false);
    pool.free(pool.malloc(8 * KIB, 0).unwrap()).unwrap(); // CuPy policy: keeps the 4 KiB chunk
    assert_eq!(pool.free_chunks(0).len(), 2);
}

#[test]
fn dropping_the_pool_returns_all_free_memory_to_the_backend() {
    let backend = Arc::new(HostBackend::new());
    {
        let pool = Pool::new(backend.clone());
        let a = pool.malloc(3 * KIB, 0).unwrap();
        let b = pool.malloc(KIB, 1).unwrap();
        pool.free(a).unwrap();
        pool.free(b).unwrap();
        assert_eq!(backend.counters().live_bytes, 4096);
    }
    assert_eq!(backend.counters().live_bytes, 0);
}

#[test]
fn blocks_still_handed_out_at_drop_are_leaked_not_freed() {
    let backend = Arc::new(HostBackend::new());
    {
        let pool = Pool::new(backend.clone());
        let whole = pool.malloc(4 * KIB, 0).unwrap();
        pool.free(whole).unwrap();
        let kept = pool.malloc(KIB, 0).unwrap();
        pool.free(pool.malloc(2 * KIB, 1).unwrap()).unwrap();
        let _leaked_without_free = kept; // a Block dropped without free leaks its chunk
    }
    // The 2 KiB allocation went back; the one with a live piece stays with the
    // backend (HostBackend frees it at its own drop).
    assert_eq!(backend.counters().live_bytes, 4096);
}

#[test]
fn freeing_a_block_of_another_pool_is_an_error_that_hands_the_block_back() {
    let (backend_one, one) = fake_pool();
    let (backend_two, two) = fake_pool();
    let kept = two.malloc(2 * KIB, 0).unwrap();
    let before = two.stats();
    let b = one.malloc(KIB, 0).unwrap();
    let addr = b.addr();
    let err = two.free(b).unwrap_err();
    assert!(matches!(err, FreeError::OtherPool(_)), "{err:?}");
    assert_eq!(err.block().addr(), addr);
    let msg = err.to_string();
    assert!(
        msg.contains("another pool") && msg.contains(&format!("{addr:#x}")),
        "{msg}"
    );
    // Neither pool changed; the block still frees in its own pool, and both keep working.
    assert_eq!(two.stats(), before);
    assert_eq!(one.used_bytes(), 1024);
    one.free(err.into_block()).unwrap();
    assert_eq!(one.free_chunks(0), vec![(addr, 1024)]);
    let again = one.malloc(KIB, 0).unwrap();
    assert_eq!(again.addr(), addr);
    one.free(again).unwrap();
    two.free(kept).unwrap();
    two.free(two.malloc(KIB, 0).unwrap()).unwrap();
    assert_consistent(&one, &backend_one);
    assert_consistent(&two, &backend_two);
    // The null block belongs to no pool: any pool takes it back as a no-op.
    two.free(one.malloc(0, 0).unwrap()).unwrap();
}

#[test]
fn host_backend_reports_a_free_it_did_not_hand_out_and_stays_usable() {
    let backend = HostBackend::new();
    let a = backend.alloc(1024).unwrap();
    assert_eq!(a % 512, 0);
    backend.free(a + 512, 1024); // unknown address
    backend.free(a, 512); // wrong size
    let c = backend.counters();
    assert_eq!(
        (c.bad_frees, c.live_allocations, c.live_bytes),
        (2, 1, 1024)
    );
    backend.free(a, 1024);
    backend.free(a, 1024); // double free
    let c = backend.counters();
    assert_eq!((c.bad_frees, c.live_allocations, c.frees), (3, 0, 1));
    assert!(backend.alloc(0).is_err());
    let b = backend.alloc(512).unwrap();
    backend.free(b, 512);
    assert_eq!(backend.counters().bad_frees, 3);
}

#[test]
fn checked_fake_backend_reports_a_free_it_did_not_hand_out() {
    let backend = FakeBackend::checked();
    let a = backend.alloc(1024).unwrap();
    backend.free(a, 512);
    backend.free(a + 1024, 1024);
    assert_eq!(backend.counters().bad_frees, 2);
    backend.free(a, 1024);
    let c = backend.counters();
    assert_eq!((c.bad_frees, c.live_bytes, c.frees), (2, 0, 1));
}

#[test]
fn host_backend_blocks_are_real_writable_memory() {
    let pool = Pool::new(HostBackend::new());
    let a = pool.malloc(2 * KIB, 0).unwrap();
    assert_eq!(a.addr() % 512, 0);
    // SAFETY: the block is 2 KiB of live host memory owned by us until `free`.
    unsafe {
        std::ptr::write_bytes(a.addr() as usize as *mut u8, 0xAB, a.size());
        assert_eq!(*((a.addr() as usize + 2047) as *const u8), 0xAB);
    }
    pool.free(a).unwrap();
}

#[test]
fn parse_limit_accepts_cupys_forms_and_rejects_bad_values() {
    let total = 80u64 << 30;
    assert_eq!(parse_limit("1073741824", total), Ok(1 << 30));
    assert_eq!(parse_limit(" 0 ", total), Ok(0));
    assert_eq!(parse_limit("40%", total), Ok(32u64 << 30));
    assert_eq!(parse_limit("12.5%", total), Ok(10u64 << 30));
    assert_eq!(parse_limit("100%", total), Ok(total));
    for bad in ["-1", "-5%", "101%", "abc", "1.5", "", "%", "NaN%"] {
        assert!(parse_limit(bad, total).is_err(), "{bad:?} must be refused");
    }
    assert!(parse_limit("-1", total).unwrap_err().contains("negative"));
    assert_eq!(limit_from_fraction(0.5, 1000), Ok(500));
    assert!(limit_from_fraction(1.5, 1000).is_err());
    assert_eq!(cuda_rt::error::human_bytes(1536 << 20), "1.50 GiB");
    assert_eq!(cuda_rt::error::human_bytes(512), "512 B");
}

#[test]
fn the_pool_and_its_blocks_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Pool<HostBackend>>();
    check::<Pool<FakeBackend>>();
    check::<Block>();
}

// ---- property tests: random operations, fixed seeds ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Roughly log-uniform in 1 ..= 2^max_log2.
    fn size(&mut self, max_log2: u64) -> usize {
        let bits = self.below(max_log2 + 1);
        (1 + self.below(1 << bits)) as usize
    }
}

/// Live blocks of all threads by address, to check that no two overlap.
type LiveMap = Mutex<BTreeMap<u64, u64>>;

fn insert_live(live: &LiveMap, b: &Block) {
    let (start, end) = (b.addr(), b.addr() + b.size() as u64);
    let mut m = live.lock().unwrap();
    if let Some((&s, &e)) = m.range(..end).next_back() {
        assert!(
            e <= start,
            "block {start:#x}..{end:#x} overlaps live {s:#x}..{e:#x}"
        );
    }
    m.insert(start, end);
}

/// Writes a byte pattern over the block (real host memory).
fn fill(b: &Block, pattern: u8) {
    // SAFETY: a live HostBackend block of `size` bytes, ours until freed.
    unsafe { std::ptr::write_bytes(b.addr() as usize as *mut u8, pattern, b.size()) }
}

fn verify(b: &Block, pattern: u8) {
    for off in [0, b.size() / 2, b.size() - 1] {
        // SAFETY: as in `fill`.
        let got = unsafe { *((b.addr() as usize + off) as *const u8) };
        assert_eq!(got, pattern, "block {b:?} was overwritten at offset {off}");
    }
}

/// One thread's random walk over `pool`: malloc / free / free_all_blocks / set_limit /
/// backend capacity, checking the invariants after every step.
fn random_walk(
    pool: &Pool<Arc<HostBackend>>,
    backend: &HostBackend,
    live_map: &LiveMap,
    seed: u64,
    steps: usize,
    keys: &[u64],
    alone: bool,
) {
    let mut rng = Rng(seed | 1);
    let max_log2 = if cfg!(miri) { 12 } else { 17 };
    let mut live: Vec<(Block, u8)> = Vec::new();
    let mut live_bytes = 0u64;
    for step in 0..steps {
        let r = rng.below(100);
        if r < 50 || live.is_empty() && r < 90 {
            let size = rng.size(max_log2);
            let key = keys[rng.below(keys.len() as u64) as usize];
            match pool.malloc(size, key) {
                Ok(b) => {
                    assert_eq!(b.size(), round_size(size).unwrap());
                    assert_eq!(b.stream_key(), key);
                    insert_live(live_map, &b);
                    let pattern = (step % 251) as u8 + 1;
                    fill(&b, pattern);
                    live_bytes += b.size() as u64;
                    live.push((b, pattern));
                }
                Err(MallocError::OutOfMemory(e)) => {
                    let cap_hit = e.cause == OutOfMemoryCause::Backend;
                    assert!(e.limit.is_some() || cap_hit, "{e}");
                    if alone {
                        let limit = e.limit.unwrap_or(u64::MAX);
                        let rounded = e.rounded.unwrap_or(u64::MAX);
                        assert!(cap_hit || e.in_use + e.cached + rounded > limit, "{e:?}");
                        assert_eq!(e.in_use, live_bytes);
                    }
                }
                Err(e) => panic!("unexpected {e}"),
            }
        } else if r < 90 {
            let (b, pattern) = live.swap_remove(rng.below(live.len() as u64) as usize);
            verify(&b, pattern);
            live_map.lock().unwrap().remove(&b.addr());
            live_bytes -= b.size() as u64;
            pool.free(b).unwrap();
        } else if r < 94 {
            let key = if rng.below(2) == 0 {
                None
            } else {
                Some(keys[rng.below(keys.len() as u64) as usize])
            };
            pool.free_all_blocks(key);
        } else if r < 97 {
            let limit = if rng.below(3) == 0 {
                0
            } else {
                (1 << max_log2) * (2 + rng.below(30))
            };
            pool.set_limit(limit);
        } else {
            let cap = if rng.below(2) == 0 {
                0
            } else {
                (1 << max_log2) * (4 + rng.below(60))
            };
            backend.set_capacity(cap);
        }
        let s = pool.stats();
        assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes);
        pool.check().unwrap();
        if alone {
            assert_eq!(s.used_bytes, live_bytes);
            assert_eq!(s.total_bytes, backend.counters().live_bytes);
            let cached: u64 = keys
                .iter()
                .flat_map(|&k| pool.free_chunks(k))
                .map(|c| c.1)
                .sum();
            assert_eq!(
                live_bytes + cached,
                s.total_bytes,
                "every byte accounted for"
            );
        }
    }
    for (b, pattern) in live {
        verify(&b, pattern);
        live_map.lock().unwrap().remove(&b.addr());
        pool.free(b).unwrap();
    }
}

fn run_random(seed: u64, threads: usize, steps: usize) {
    let backend = Arc::new(HostBackend::new());
    let pool = Pool::new(backend.clone());
    let live_map = LiveMap::default();
    let keys = [1u64, 2, 3, 0xdead_beef];
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pool, backend, live_map) = (&pool, &*backend, &live_map);
            s.spawn(move || {
                let seed = seed.wrapping_mul(0x9E37_79B9).wrapping_add(t as u64);
                // Each thread uses its own key plus keys shared with the others.
                let mine = [
                    keys[t % keys.len()],
                    keys[(t + 1) % keys.len()],
                    100 + t as u64,
                ];
                random_walk(pool, backend, live_map, seed, steps, &mine, threads == 1);
            });
        }
    });
    let s = pool.stats();
    assert_eq!(s.used_bytes, 0);
    assert_eq!(s.mallocs, s.frees);
    pool.check().unwrap();
    pool.free_all_blocks(None);
    assert_eq!(
        pool.stats().total_bytes,
        0,
        "all free chunks merge back to whole allocations"
    );
    assert_eq!(pool.stats().n_free_blocks, 0);
    drop(pool);
    let c = backend.counters();
    assert_eq!((c.live_bytes, c.live_allocations, c.bad_frees), (0, 0, 0));
    assert_eq!(c.allocs, c.frees);
}

#[test]
fn random_operations_on_one_thread_keep_every_invariant() {
    let (seeds, steps) = if cfg!(miri) { (1, 150) } else { (5, 3000) };
    for seed in 1..=seeds {
        run_random(seed, 1, steps);
    }
}

#[test]
fn random_operations_on_several_threads_keep_every_invariant() {
    let (seeds, threads, steps) = if cfg!(miri) { (1, 2, 40) } else { (3, 4, 1500) };
    for seed in 1..=seeds {
        run_random(seed, threads, steps);
    }
}

/// Granule of the expandable random walks: small, so that blocks share granules and
/// free chunks have partial ones.
const WALK_GRANULE: u64 = 64 * KIB as u64;

/// Whether every granule of `b` is mapped.
fn mapped_whole(backend: &FakeBackend, addr: u64, size: u64) -> bool {
    let first = addr & !(WALK_GRANULE - 1);
    (first..addr + size)
        .step_by(WALK_GRANULE as usize)
        .all(|g| backend.is_mapped(g))
}

/// One thread's random walk over a pool with expandable segments (so growths punch
/// holes and map into them): malloc / free / free after a fence / fences completing /
/// free_all_blocks / limit / capacity, checking after every step that the invariants
/// hold, that no two live blocks overlap, and that every live block (alone: every
/// block of the pool, live, awaiting or cached) lies in mapped granules.
fn random_walk_expandable(
    pool: &Pool<Arc<FakeBackend>>,
    backend: &FakeBackend,
    live_map: &LiveMap,
    seed: u64,
    steps: usize,
    keys: &[u64],
    alone: bool,
) {
    let mut rng = Rng(seed | 1);
    let max_log2 = if cfg!(miri) { 17 } else { 19 };
    let mut live: Vec<Block> = Vec::new();
    // Fences not completed yet (the pool may also have waited for them).
    let mut awaiting: Vec<u64> = Vec::new();
    for _ in 0..steps {
        let r = rng.below(100);
        if r < 50 || live.is_empty() && r < 85 {
            let size = rng.size(max_log2);
            let key = keys[rng.below(keys.len() as u64) as usize];
            match pool.malloc(size, key) {
                Ok(b) => {
                    insert_live(live_map, &b);
                    live.push(b);
                }
                Err(MallocError::OutOfMemory(_)) => {}
                Err(e) => panic!("unexpected {e}"),
            }
        } else if r < 85 {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            live_map.lock().unwrap().remove(&b.addr());
            if rng.below(4) == 0 {
                let fence = backend.new_fence();
                awaiting.push(fence);
                pool.free_after(b, &[StreamFence { stream: 99, fence }])
                    .unwrap();
            } else {
                pool.free(b).unwrap();
            }
        } else if r < 91 && !awaiting.is_empty() {
            let fence = awaiting.swap_remove(rng.below(awaiting.len() as u64) as usize);
            backend.complete_fence(fence);
        } else if r < 94 {
            pool.free_all_blocks(None);
        } else if r < 97 {
            let limit = if rng.below(3) == 0 {
                0
            } else {
                (1 << max_log2) * (4 + rng.below(40))
            };
            pool.set_limit(limit);
        } else {
            let cap = if rng.below(2) == 0 {
                0
            } else {
                (1 << max_log2) * (8 + rng.below(60))
            };
            backend.set_capacity(cap);
        }
        pool.check().unwrap();
        let k = backend.counters();
        assert_eq!((k.bad_segment_calls, k.bad_frees), (0, 0));
        for b in &live {
            assert!(
                mapped_whole(backend, b.addr(), b.size() as u64),
                "live {b:?} unmapped"
            );
        }
        if alone {
            // Every chunk the pool holds (handed out, awaiting its streams, or cached)
            // lies in mapped granules: holes are never in a snapshot. (With other
            // threads, theirs may be punched between the snapshot and the check.)
            let snap = pool.snapshot();
            for blk in snap.segments.iter().flat_map(|s| &s.blocks) {
                assert!(
                    mapped_whole(backend, blk.address, blk.size),
                    "{blk:?} unmapped"
                );
            }
            let s = pool.stats();
            assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes);
            assert_eq!(s.total_bytes, k.live_bytes, "reserved is what is mapped");
        }
    }
    for fence in awaiting {
        backend.complete_fence(fence);
    }
    for b in live {
        live_map.lock().unwrap().remove(&b.addr());
        pool.free(b).unwrap();
    }
}

/// Runs one walk; returns the holes it punched.
fn run_random_expandable(seed: u64, threads: usize, steps: usize) -> u64 {
    let backend = Arc::new(FakeBackend::checked().with_segments(SegmentSpec {
        granularity: WALK_GRANULE,
        reserve: 32 * WALK_GRANULE,
    }));
    let pool = Pool::new(backend.clone());
    pool.set_expandable_segments(true);
    let live_map = LiveMap::default();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pool, backend, live_map) = (&pool, &*backend, &live_map);
            s.spawn(move || {
                let seed = seed.wrapping_mul(0x9E37_79B9).wrapping_add(t as u64);
                let keys = [1, 2 + t as u64 % 2];
                random_walk_expandable(pool, backend, live_map, seed, steps, &keys, threads == 1);
            });
        }
    });
    pool.set_limit(0);
    backend.set_capacity(0);
    pool.check().unwrap();
    // The last fences completed after the walk: a poll frees those blocks.
    pool.free_all_blocks(None);
    let s = pool.stats();
    assert_eq!(
        (s.used_bytes, s.total_bytes, s.awaiting_blocks),
        (0, 0, 0),
        "{s:?}"
    );
    drop(pool);
    let c = backend.counters();
    assert_eq!(
        (
            c.live_bytes,
            c.live_segments,
            c.bad_segment_calls,
            c.live_fences
        ),
        (0, 0, 0, 0)
    );
    s.holes_punched
}

/// The full walks must have punched holes, or they tested nothing of it. Miri's short
/// walks seldom reach a growth past the peak with whole granules free (punching happens
/// only there); under Miri the unit tests of src/memory/arena/bins/holes.rs (which Miri
/// runs too) cover punching, and the walks look for undefined behaviour.
fn assert_punched(holes: u64) {
    assert!(cfg!(miri) || holes > 0, "the walks punched no hole");
}

#[test]
fn random_operations_with_expandable_segments_keep_every_invariant() {
    let (seeds, steps) = if cfg!(miri) { (1, 150) } else { (6, 3000) };
    let holes = (1..=seeds)
        .map(|seed| run_random_expandable(seed, 1, steps))
        .sum();
    assert_punched(holes);
}

#[test]
fn random_operations_with_expandable_segments_on_several_threads_keep_every_invariant() {
    let (seeds, threads, steps) = if cfg!(miri) { (1, 2, 40) } else { (3, 4, 1500) };
    let holes = (1..=seeds)
        .map(|seed| run_random_expandable(seed, threads, steps))
        .sum();
    assert_punched(holes);
}

#[test]
fn dropping_the_pool_with_everything_free_returns_all_memory() {
    let backend = Arc::new(HostBackend::new());
    {
        let pool = Pool::new(backend.clone());
        let mut rng = Rng(7);
        let mut live = Vec::new();
        for _ in 0..if cfg!(miri) { 30 } else { 500 } {
            if rng.below(3) < 2 {
                live.push(pool.malloc(rng.size(14), rng.below(3)).unwrap());
            } else if !live.is_empty() {
                pool.free(live.swap_remove(rng.below(live.len() as u64) as usize))
                    .unwrap();
            }
        }
        for b in live {
            pool.free(b).unwrap();
        }
        assert!(backend.counters().live_bytes > 0);
    }
    assert_eq!(backend.counters().live_bytes, 0);
}

/// CuPy's algorithm written the slow, obvious way: free chunks in a list, best fit by
/// `(size, addr)`, split keeps the lower part, free merges neighbours of the same
/// backend allocation.
#[derive(Default)]
struct Model {
    /// `(addr, size, allocation)` of every free chunk.
    free: Vec<(u64, u64, usize)>,
    /// `addr -> (size, allocation)` of every chunk handed out.
    used: BTreeMap<u64, (u64, usize)>,
    allocations: usize,
}

impl Model {
    /// The address best fit gives for `size` (rounded), if a free chunk fits.
    fn predict(&self, size: u64) -> Option<u64> {
        self.free
            .iter()
            .filter(|c| c.1 >= size)
            .min_by_key(|c| (c.1, c.0))
            .map(|c| c.0)
    }

    fn malloc(&mut self, addr: u64, size: u64, hit: bool) {
        if hit {
            let i = self.free.iter().position(|c| c.0 == addr).unwrap();
            let (a, s, alloc) = self.free.swap_remove(i);
            if s > size {
                self.free.push((a + size, s - size, alloc));
            }
            self.used.insert(addr, (size, alloc));
        } else {
            self.allocations += 1;
            self.used.insert(addr, (size, self.allocations));
        }
    }

    fn free(&mut self, addr: u64) {
        let (mut size, alloc) = self.used.remove(&addr).unwrap();
        let mut start = addr;
        if let Some(i) = self
            .free
            .iter()
            .position(|c| c.2 == alloc && c.0 + c.1 == start)
        {
            let c = self.free.swap_remove(i);
            start = c.0;
            size += c.1;
        }
        if let Some(i) = self
            .free
            .iter()
            .position(|c| c.2 == alloc && c.0 == start + size)
        {
            size += self.free.swap_remove(i).1;
        }
        self.free.push((start, size, alloc));
    }
}

#[test]
fn every_malloc_returns_the_address_plain_best_fit_would() {
    let steps = if cfg!(miri) { 300 } else { 20_000 };
    let (backend, pool) = fake_pool();
    let mut model = Model::default();
    let mut live: Vec<Block> = Vec::new();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Few distinct sizes, so equal sizes (address ties), splits and merges are common.
    let sizes = [512u64, 1024, 1536, 4096, 8192, 64 * 1024, 1 << 20];
    for step in 0..steps {
        let r = next();
        if live.len() < 48 && (live.is_empty() || r % 100 < 55) {
            let size = sizes[(r >> 8) as usize % sizes.len()] as usize;
            let predicted = model.predict(size as u64);
            let b = pool.malloc(size, 7).unwrap();
            if let Some(p) = predicted {
                assert_eq!(b.addr(), p, "step {step}: malloc({size}) left best fit");
            }
            model.malloc(b.addr(), b.size() as u64, predicted.is_some());
            live.push(b);
        } else {
            let b = live.swap_remove((r >> 8) as usize % live.len());
            model.free(b.addr());
            pool.free(b).unwrap();
        }
        assert_eq!(pool.n_free_blocks(), model.free.len() as u64, "step {step}");
        if step % 64 == 0 {
            assert_consistent(&pool, &backend);
        }
    }
    for b in live {
        pool.free(b).unwrap();
    }
    assert_consistent(&pool, &backend);
}

// A fence that cannot be queried is not a finished fence: while another thread holds
// a global-mode capture every `cuEventQuery` and `cuEventSynchronize` fails although
// the stream still uses the block (`HostBackend::set_fences_fail` plays that part).

fn host_pool() -> (Arc<HostBackend>, Pool<Arc<HostBackend>>) {
    let backend = Arc::new(HostBackend::new());
    (backend.clone(), Pool::new(backend))
}

/// A block of `size` bytes given back after a fence on stream 2, not done yet.
fn awaiting_block(
    backend: &HostBackend,
    pool: &Pool<Arc<HostBackend>>,
    size: usize,
) -> (u64, StreamFence) {
    let a = pool.malloc(size, 1).unwrap();
    let addr = a.addr();
    let f = StreamFence {
        stream: 2,
        fence: backend.new_fence(),
    };
    pool.free_after(a, &[f]).unwrap();
    (addr, f)
}

#[test]
fn a_block_whose_fence_query_fails_stays_awaiting_until_a_later_query_succeeds() {
    let (backend, pool) = host_pool();
    let (addr, f) = awaiting_block(&backend, &pool, 4096);
    backend.set_fences_fail(true);
    let mut held = Vec::new();
    for round in 0..3 {
        // Each miss polls (and fails to query); nothing may hand the block out.
        let b = pool.malloc(4096, 1).unwrap();
        assert_ne!(
            b.addr(),
            addr,
            "round {round}: a block in use was handed out"
        );
        assert!(!pool.poll_awaiting());
        held.push(b);
        if round == 1 {
            // The work finished, but no query can say so yet: still kept.
            backend.complete_fence(f.fence);
        }
    }
    let s = pool.stats();
    assert_eq!((s.awaiting_blocks, s.awaiting_bytes), (1, 4096));
    assert!(backend.counters().fence_queries >= 6);
    // The capture ended: the next query succeeds, and the next miss reuses the block.
    backend.set_fences_fail(false);
    let c = pool.malloc(4096, 1).unwrap();
    assert_eq!(c.addr(), addr, "the completed block is reused");
    assert_eq!(pool.stats().awaiting_blocks, 0);
    for b in held.into_iter().chain([c]) {
        pool.free(b).unwrap();
    }
    pool.check().unwrap();
    let k = backend.counters();
    assert_eq!((k.live_fences, k.bad_fence_releases), (0, 0));
}

#[test]
fn a_failed_fence_wait_on_out_of_memory_keeps_the_block_awaiting() {
    let backend = Arc::new(HostBackend::with_capacity(8192));
    let pool = Pool::new(backend.clone());
    let _ = awaiting_block(&backend, &pool, 8192);
    backend.set_fences_fail(true);
    // Another arena needs the memory: the wait fails, so the block is neither handed
    // out nor given back to the backend, and the malloc is out of memory.
    let e = oom(pool.malloc(8192, 5));
    assert_eq!(e.requested, 8192, "{e}");
    let s = pool.stats();
    assert_eq!(
        (s.awaiting_blocks, s.total_bytes, s.oom_retries),
        (1, 8192, 1)
    );
    assert!(s.fence_syncs >= 1, "the wait was tried: {s:?}");
    let k = backend.counters();
    assert_eq!((k.live_bytes, k.frees, k.bad_frees), (8192, 0, 0));
    // In the same arena too: the awaiting block is not the cache's to hand out.
    assert!(matches!(
        pool.malloc(8192, 1),
        Err(MallocError::OutOfMemory(_))
    ));
    // Once waits succeed again the out-of-memory path waits, releases and retries.
    backend.set_fences_fail(false);
    let b = pool.malloc(8192, 5).unwrap();
    assert_eq!(pool.stats().awaiting_blocks, 0);
    pool.free(b).unwrap();
    pool.check().unwrap();
    assert_eq!(backend.counters().live_fences, 0);
}

#[test]
fn free_all_blocks_keeps_a_block_whose_fence_query_fails() {
    let (backend, pool) = host_pool();
    let (_addr, f) = awaiting_block(&backend, &pool, 4096);
    backend.complete_fence(f.fence);
    backend.set_fences_fail(true);
    pool.free_all_blocks(None);
    assert_eq!(pool.stats().total_bytes, 4096, "not known done: kept");
    assert_eq!(backend.counters().live_bytes, 4096);
    backend.set_fences_fail(false);
    pool.free_all_blocks(None);
    assert_eq!(pool.stats().total_bytes, 0);
    let k = backend.counters();
    assert_eq!((k.live_bytes, k.live_fences, k.bad_frees), (0, 0, 0));
}

#[test]
fn dropping_the_pool_leaks_a_block_whose_fence_never_answers() {
    let backend = Arc::new(HostBackend::new());
    {
        let pool = Pool::new(backend.clone());
        let _ = awaiting_block(&backend, &pool, 4096);
        let live = pool.malloc(512, 1).unwrap();
        pool.free(live).unwrap();
        // A dead context: no query or wait will ever succeed.
        backend.set_fences_fail(true);
    }
    // The block's allocation is never given back (the stream may still use it); the
    // other one is, and the fence is released.
    let k = backend.counters();
    assert_eq!(
        (
            k.live_bytes,
            k.live_fences,
            k.bad_frees,
            k.bad_fence_releases
        ),
        (4096, 0, 0, 0)
    );
}

#[test]
fn a_failed_query_holds_back_the_later_fences_of_its_stream() {
    let (backend, pool) = host_pool();
    let (_, f1) = awaiting_block(&backend, &pool, 512);
    let (_, f2) = awaiting_block(&backend, &pool, 512);
    backend.complete_fence(f1.fence);
    backend.complete_fence(f2.fence);
    // Both done, but the first query fails: the stream counts as not past its
    // first fence, so its later fence is not even asked about.
    backend.set_fences_fail(true);
    let before = backend.counters().fence_queries;
    assert!(!pool.poll_awaiting());
    assert_eq!(backend.counters().fence_queries, before + 1);
    assert_eq!(pool.stats().awaiting_blocks, 2);
    backend.set_fences_fail(false);
    assert!(pool.poll_awaiting());
    assert_eq!(pool.stats().awaiting_blocks, 0);
    assert_eq!(pool.free_chunks(1).len(), 2);
    pool.check().unwrap();
}
