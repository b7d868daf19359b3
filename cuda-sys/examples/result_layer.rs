//! A small binding written on the checked layer, `cuda_sys::result`: a device buffer
//! type that owns its allocation, with copies in and out on a stream of its own.
//!
//! `cargo run -p cuda-rt-sys --example result_layer`. Without a driver or a device it
//! says why and exits cleanly: every failure is an `Err`, never a panic.

use cuda_sys::driver::{CUcontext, CUdevice, CUdeviceptr, CUstream, CUstream_flags};
use cuda_sys::result::{self, context, device, memory, stream};

/// The primary context of a device, retained while this value lives and current on
/// the thread that made it.
struct Context {
    dev: CUdevice,
    ctx: CUcontext,
}

impl Context {
    fn new(ordinal: i32) -> result::Result<Context> {
        let dev = device::get(ordinal)?;
        let ctx = context::primary_ctx_retain(dev)?;
        let me = Context { dev, ctx };
        // SAFETY: `ctx` is retained by `me` until its drop.
        unsafe { context::set_current(me.ctx) }?;
        Ok(me)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the retain taken in `new`, given back once; the buffers and streams
        // of this example are dropped before the context.
        let _ = unsafe { context::primary_ctx_release(self.dev) };
    }
}

/// A stream of the current context, destroyed on drop.
struct Stream(CUstream);

impl Stream {
    fn new(_ctx: &Context) -> result::Result<Stream> {
        Ok(Stream(stream::create_with_priority(
            CUstream_flags::CU_STREAM_NON_BLOCKING.0,
            0,
        )?))
    }

    fn synchronize(&self) -> result::Result<()> {
        // SAFETY: the stream is owned by `self` and live.
        unsafe { stream::synchronize(self.0) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: owned by `self`, destroyed once.
        let _ = unsafe { stream::destroy(self.0) };
    }
}

/// `len` bytes of device memory, freed on drop.
struct DeviceBuffer {
    ptr: CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    fn new(_ctx: &Context, len: usize) -> result::Result<DeviceBuffer> {
        Ok(DeviceBuffer {
            ptr: memory::alloc(len)?,
            len,
        })
    }

    /// Copies `src` in on `s` and waits: `src` is borrowed only for the call.
    fn copy_from(&mut self, src: &[u8], s: &Stream) -> result::Result<()> {
        assert!(src.len() <= self.len, "the buffer holds {} bytes", self.len);
        // SAFETY: the destination is `src.len()` bytes of this allocation (checked
        // above); `src` stays borrowed until the copy is waited for below; the stream
        // is live.
        unsafe { memory::memcpy_htod_async(self.ptr, src.as_ptr().cast(), src.len(), s.0) }?;
        s.synchronize()
    }

    /// Copies the first `dst.len()` bytes out on `s` and waits.
    fn copy_to(&self, dst: &mut [u8], s: &Stream) -> result::Result<()> {
        assert!(dst.len() <= self.len, "the buffer holds {} bytes", self.len);
        // SAFETY: as in `copy_from`, with `dst` borrowed mutably until the copy ends.
        unsafe { memory::memcpy_dtoh_async(dst.as_mut_ptr().cast(), self.ptr, dst.len(), s.0) }?;
        s.synchronize()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the allocation is owned by `self`, freed once; cuMemFree waits for
        // work still using it.
        let _ = unsafe { memory::free(self.ptr) };
    }
}

fn run() -> result::Result<()> {
    if let Err(e) = result::init() {
        println!("no usable CUDA driver: {e}");
        return Ok(());
    }
    let v = result::version()?;
    println!("CUDA driver for CUDA {}", cuda_sys::format_version(v));
    let n = device::get_count()?;
    if n == 0 {
        println!("the driver reports no device");
        return Ok(());
    }
    let ctx = Context::new(0)?;
    println!("device 0: {}", device::get_name(ctx.dev)?);
    let s = Stream::new(&ctx)?;
    let data: Vec<u8> = (0..=255).collect();
    let mut buf = DeviceBuffer::new(&ctx, data.len())?;
    buf.copy_from(&data, &s)?;
    let mut back = vec![0u8; data.len()];
    buf.copy_to(&mut back, &s)?;
    assert_eq!(back, data);
    println!("{} bytes copied to the device and back", data.len());
    // And an error, in the layer's words.
    match memory::alloc(usize::MAX) {
        Ok(p) => {
            // SAFETY: just allocated, freed once.
            unsafe { memory::free(p) }?;
        }
        Err(e) => println!("allocating usize::MAX bytes: {e}"),
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        println!("error: {e}");
        std::process::exit(1);
    }
}
