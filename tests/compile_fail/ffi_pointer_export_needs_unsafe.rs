// An export that writes through a raw pointer is an unsafe fn for Rust callers: a
// made-up out-pointer from safe code does not compile.
fn main() {
    let bogus = 0x10 as *mut i32;
    let _ = cuda_rt_c::curt_device_count(bogus);
}
