//! Without a GPU, the GPU tests skip, and the test binary says so when it exits
//! (libtest itself counts them as passed).

use std::process::Command;

cuda_rt::gpu_test!(a_gpu_test_that_skips_without_a_gpu, {
    assert!(cuda_rt::is_available());
    println!("the GPU test body ran");
});

#[test]
fn the_binary_says_at_exit_how_many_gpu_tests_did_not_run() {
    if std::env::var_os("CUDA_RT_SKIP_CHILD").is_some() {
        return;
    }
    // This binary again, running only the GPU test above, with no device visible (on a
    // machine without a driver it skips anyway).
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_gpu_test_that_skips_without_a_gpu",
            "--nocapture",
        ])
        .env("CUDA_RT_SKIP_CHILD", "1")
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("CUDA_RT_REQUIRE_GPU")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    if stdout.contains("the GPU test body ran") {
        // A device stayed visible (compute-sanitizer's injection ignores
        // CUDA_VISIBLE_DEVICES): nothing skipped, so there is nothing to report.
        assert!(!stderr.contains("did not run"), "{stderr}");
        return;
    }
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(
        stderr.contains("note: 1 GPU test of this binary did not run (no GPU: "),
        "{stderr}"
    );
    assert!(stderr.contains("CUDA_RT_REQUIRE_GPU=1"), "{stderr}");
}

#[test]
fn the_summary_counts_in_the_plural() {
    let s = cuda_rt::testing::skip_summary(3, "no driver");
    assert!(s.starts_with("note: 3 GPU tests of this binary did not run (no GPU: no driver)"));
    assert!(s.contains("counts them as passed"));
}
