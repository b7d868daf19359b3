// AsStream is sealed: safe code cannot hand the driver a made-up stream handle.
use cuda_rt::cuda_sys::driver::CUstream;
use cuda_rt::{AsStream, StreamRef};

struct Forged;

impl AsStream for Forged {
    fn as_raw(&self) -> CUstream {
        0xdead as CUstream
    }
    fn device_id(&self) -> i32 {
        0
    }
    fn as_stream_ref(&self) -> StreamRef {
        StreamRef::legacy_default(0)
    }
}

fn main() {
    let _ = Forged.synchronize();
}
