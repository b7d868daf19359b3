//! PyTorch's other pluggable-allocator hooks, so its Python calls reach cuda-rt's
//! pool: `torch.cuda.empty_cache()` (`set_reset_fn`) and
//! `torch.cuda.set_per_process_memory_fraction()` (`set_memory_fraction_fn`). Their
//! signatures are PyTorch's (no status): a failure is recorded for
//! `curt_last_error()` and, for the fraction, thrown into PyTorch when it is loaded.

use std::ffi::c_int;

use cuda_rt::device::device_count;
use cuda_rt::{get_default_memory_pool, Device};

use super::status::{guard, set_last_error};

/// `torch.cuda.empty_cache()`: the default pool's cached blocks of every device go
/// back to the driver (blocks in use stay).
#[no_mangle]
pub extern "C" fn curt_torch_empty_cache() {
    let _ = guard(|| {
        let pool = get_default_memory_pool();
        for d in 0..device_count().unwrap_or(0) {
            let _scope = Device::new(d)?.enter()?;
            pool.free_all_blocks(None);
        }
        Ok(())
    });
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`: the default pool's
/// limit on `device` becomes `fraction` of its total memory (0 < fraction <= 1).
#[no_mangle]
pub extern "C-unwind" fn curt_torch_set_memory_fraction(fraction: f64, device: c_int) {
    let code = guard(|| {
        let _scope = Device::new(device)?.enter()?;
        Ok(get_default_memory_pool().set_limit_fraction(fraction)?)
    });
    if code != 0 {
        let msg = super::status::last_error_string();
        super::torch_error::raise_in_torch(&msg);
        set_last_error(&msg);
    }
}
