// The driver trusts an `AsFunction`'s raw handle: implementing it is an unsafe
// promise, so a safe `impl` with a made-up handle does not compile.
use std::any::Any;
use std::sync::Arc;

use cuda_rt::cuda_sys::driver::CUfunction;
use cuda_rt::graph::AsFunction;

struct MadeUp;

impl AsFunction for MadeUp {
    fn as_raw(&self) -> CUfunction {
        0x1234 as CUfunction
    }
    fn device_id(&self) -> i32 {
        0
    }
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(())
    }
}

fn main() {}
