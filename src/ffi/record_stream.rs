//! Cross-stream use of pool memory (PyTorch's `record_stream`): mark a block as used
//! by another stream, so that once freed it is handed out again only after that
//! stream's work up to the free has completed (an event recorded at the free, polled
//! by the pool; see `cuda_rt::memory::MemoryPointer::record_stream`). For handles of
//! `curt_malloc`, and for addresses of the drop-in allocator (the hook PyTorch's
//! `CUDAPluggableAllocator` calls).

use std::ffi::{c_int, c_void};

use cuda_rt::stream::ExternalStream;

use super::allocator::dropin_pointer;
use super::handles::{curt_memory_t, curt_stream_t};
use super::memory::MEMORY;
use super::status::{guard, set_last_error, unwind_guard, Res};
use super::stream::stream_or_current;

/// Marks `mem` as used by `stream` (NULL: the current stream): when `mem` is freed,
/// its memory is not reused before the work queued on `stream` until then has
/// completed. Nothing for `mem`'s own stream, or for memory that is not pooled.
#[no_mangle]
pub extern "C" fn curt_pool_record_stream(mem: curt_memory_t, stream: curt_stream_t) -> c_int {
    guard(|| {
        let s = stream_or_current(stream)?;
        MEMORY.get(mem as u64)?.record_stream(&s)?;
        Ok(())
    })
}

/// PyTorch's `CUDAPluggableAllocator` record-stream hook: marks the memory that
/// `curt_torch_alloc` (or `curt_cupy_malloc`) handed out at `ptr` as used by `stream`
/// (a `cudaStream_t`/`CUstream` of the memory's device, or 0), so that once freed it
/// is reused only after `stream`'s work up to the free. An unknown `ptr` records an
/// error (curt_last_error), nothing else.
///
/// # Safety
/// `stream` is 0 or a live stream of the memory's device that stays alive until the
/// memory is freed (PyTorch's streams live for the whole process).
#[no_mangle]
pub unsafe extern "C" fn curt_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    unwind_guard(
        || {
            let r: Res<()> = (|| {
                let p = dropin_pointer(ptr)?;
                // SAFETY: wrapper.h's contract for curt_torch_record_stream: `stream` is
                // 0 or a live stream of the memory's device, alive until it is freed.
                let s = unsafe { ExternalStream::from_raw(stream.cast(), p.device_id()) };
                p.record_stream(&s)?;
                Ok(())
            })();
            if let Err(e) = r {
                set_last_error(&e.code_and_message().1);
            }
        },
        (),
    )
}
