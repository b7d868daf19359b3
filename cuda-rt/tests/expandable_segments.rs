//! Expandable segments of the device pool on a real GPU (`MemoryPool::
//! set_expandable_segments`): a segment grows in place under live blocks whose data
//! stays intact, the grown memory is readable and writable, and releasing the cache
//! unmaps the free tails. Without a GPU each test skips (see `cuda_rt::testing`).

use cuda_rt::gpu_test;
use cuda_rt::memory::MemoryPool;

const MIB: usize = 1 << 20;

/// Taken by every test here: one of them reads the device's free memory, which the
/// others' segments would move.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn pattern(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

gpu_test!(
    an_expandable_pool_grows_its_segment_in_place_and_keeps_the_data,
    {
        let _alone = alone();
        cuda_rt::device::set_device_id(0).unwrap();
        let pool = MemoryPool::new();
        pool.set_expandable_segments(true).unwrap();
        assert!(pool.expandable_segments().unwrap(), "the driver has VMM");
        let a = pool.malloc(3 * MIB).unwrap();
        let pa = pattern(3 * MIB / 4, 1);
        a.copy_from_host(&pa).unwrap();
        // Past the first granule(s): the segment grows under `b`, right after `a`.
        let b = pool.malloc(3 * MIB).unwrap();
        assert_eq!(
            b.ptr(),
            a.ptr() + 3 * MIB as u64,
            "b follows a in the segment"
        );
        b.copy_from_host(&pattern(3 * MIB / 4, 2)).unwrap();
        drop(b);
        // Larger than anything cached: the free tail after `a` grows in place.
        let c = pool.malloc(40 * MIB).unwrap();
        assert_eq!(
            c.ptr(),
            a.ptr() + 3 * MIB as u64,
            "c reuses and extends the tail"
        );
        let pc = pattern(40 * MIB / 4, 3);
        c.copy_from_host(&pc).unwrap();
        let mut back = vec![0u32; 40 * MIB / 4];
        c.copy_to_host(&mut back).unwrap();
        assert!(back == pc, "the grown memory holds what was written");
        let mut back_a = vec![0u32; 3 * MIB / 4];
        a.copy_to_host(&mut back_a).unwrap();
        assert!(back_a == pa, "a's data survived the growth");
        let s = pool.stats();
        assert_eq!(s.total_bytes % (2 * MIB as u64), 0, "granule-mapped: {s:?}");
        assert!(s.total_bytes >= 43 * MIB as u64, "{s:?}");
        drop(c);
        drop(a);
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 0, "free tails unmapped");
    }
);

gpu_test!(
    an_expandable_pool_unmaps_a_free_tail_and_keeps_the_live_head,
    {
        let _alone = alone();
        cuda_rt::device::set_device_id(0).unwrap();
        let pool = MemoryPool::new();
        pool.set_expandable_segments(true).unwrap();
        let a = pool.malloc(5 * MIB).unwrap();
        let b = pool.malloc(64 * MIB).unwrap();
        drop(b);
        pool.free_all_blocks(None);
        let s = pool.stats();
        assert!(s.total_bytes < 16 * MIB as u64, "the tail went back: {s:?}");
        // The head is still mapped and usable; growing again maps fresh memory.
        let pa = pattern(5 * MIB / 4, 7);
        a.copy_from_host(&pa).unwrap();
        let c = pool.malloc(32 * MIB).unwrap();
        c.memset_u32(0xA5A5_A5A5, 8 * MIB).unwrap();
        let mut back = vec![0u32; 8 * MIB];
        c.copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&v| v == 0xA5A5_A5A5));
        let mut back_a = vec![0u32; 5 * MIB / 4];
        a.copy_to_host(&mut back_a).unwrap();
        assert!(back_a == pa);
    }
);

gpu_test!(an_expandable_pool_frees_everything_when_it_goes, {
    let _alone = alone();
    cuda_rt::device::set_device_id(0).unwrap();
    let (free_before, _) = cuda_rt::cuda_sys::result::memory::get_info().unwrap();
    {
        let pool = MemoryPool::new();
        pool.set_expandable_segments(true).unwrap();
        let blocks: Vec<_> = (1..8).map(|i| pool.malloc(i * 7 * MIB).unwrap()).collect();
        drop(blocks);
    }
    let (free_after, _) = cuda_rt::cuda_sys::result::memory::get_info().unwrap();
    assert!(
        free_after + 16 * MIB >= free_before,
        "{free_before} bytes free before, {free_after} after"
    );
});

gpu_test!(
    a_tail_left_mapped_by_an_unmap_that_could_not_wait_is_unmapped_before_it_grows_again,
    {
        use cuda_rt::graph::CaptureMode;
        use cuda_rt::{Stream, StreamCaptureExt};
        let _alone = alone();
        cuda_rt::device::set_device_id(0).unwrap();
        let pool = MemoryPool::new();
        pool.set_expandable_segments(true).unwrap();
        let a = pool.malloc(5 * MIB).unwrap();
        let pa = pattern(5 * MIB / 4, 9);
        a.copy_from_host(&pa).unwrap();
        let b = pool.malloc(64 * MIB).unwrap();
        drop(b);
        // This thread's capture refuses the wait before the unmap: the free tail
        // stays mapped while the pool's books give it back.
        let s = Stream::non_blocking().unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        pool.free_all_blocks(None);
        let _ = s.end_capture();
        let st = pool.stats();
        assert!(
            st.total_bytes < 16 * MIB as u64,
            "the books gave the tail back: {st:?}"
        );
        // Growing over that tail again waits, unmaps what was left, and maps anew.
        let c = pool.malloc(32 * MIB).unwrap();
        assert_eq!(
            c.ptr(),
            a.ptr() + 5 * MIB as u64,
            "c grows the same segment"
        );
        c.memset_u32(0x5A5A_5A5A, 8 * MIB).unwrap();
        let mut back = vec![0u32; 8 * MIB];
        c.copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&v| v == 0x5A5A_5A5A));
        let mut back_a = vec![0u32; 5 * MIB / 4];
        a.copy_to_host(&mut back_a).unwrap();
        assert!(back_a == pa, "a's data survived");
        drop((a, c));
        // And nothing is left mapped once the pool goes: its reservation is freed.
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 0);
    }
);
