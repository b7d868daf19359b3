//! A device error does not leave a completion pending forever: the driver calls the
//! stream callback with the error, and the future resolves to it. A device error
//! breaks the context for the whole process, so the failing kernel runs in a child
//! process (this test binary run again with one test and a variable set), which must
//! resolve within its watchdog's time and exit 0.
//!
//! Under compute-sanitizer the kernel's deliberate fault is reported as an error (a
//! failing run): leave this binary out there (`SKIP=completion_device_error`).

mod common_kernel;

use std::process::Command;

use cuda_rt::compiler::RawKernel;
use cuda_rt::launch::LaunchConfig;
use cuda_rt::stream::Stream;
use cuda_rt::{gpu_test, AsStream};

/// Set in the child: run the fault.
const CHILD_VAR: &str = "CUDA_RT_COMPLETION_FAULT_CHILD";

/// Writes through a null pointer: an illegal address, a sticky error.
const FAULT: &str = r#"
extern "C" __global__ void fault(unsigned int* p) { *(volatile unsigned int*)p = 1u; }
"#;

gpu_test!(a_device_error_resolves_the_completion_with_the_error, {
    if !common_kernel::nvrtc_or_skip("a_device_error_resolves_the_completion_with_the_error") {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_awaits_a_faulting_kernel", "--nocapture"])
        .arg("--test-threads=1")
        .env(CHILD_VAR, "1")
        .output()
        .expect("the test binary runs again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child: {text}");
    assert!(text.contains("resolved to the device error"), "{text}");
});

/// The child's part (does nothing unless the variable is set).
#[test]
fn child_awaits_a_faulting_kernel() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    // A hang is the failure this test is about: end the child instead.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(60));
        eprintln!("the completion never resolved");
        std::process::exit(3);
    });
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(FAULT, "fault", &[]).unwrap();
    let s = Stream::non_blocking().unwrap();
    // SAFETY: fault(unsigned* p) writes through a null device pointer on purpose: a
    // device fault the driver reports as an error (no host memory is touched), in a
    // child process that exists only to see that error.
    unsafe { cuda_rt::launch!(k, &LaunchConfig::new(1, 1), &s, (0u64,)) }.unwrap();
    let r = futures::executor::block_on(s.completion());
    let e = r.expect_err("a faulting kernel's completion resolved to Ok");
    assert!(e.driver_code().is_some(), "not the driver's error: {e}");
    println!("resolved to the device error: {e}");
}
