//! Without a GPU, the GPU tests skip, each says so once, and the test binary says when
//! it exits how many of its tests ran for real and how many did not, and why (libtest
//! itself counts them as passed).

use std::process::Command;

use cuda_rt::testing::{skip_summary, Tally, NO_CHROMIUM, NO_GPU, NO_NVRTC};

cuda_rt::gpu_test!(a_gpu_test_that_skips_without_a_gpu, {
    assert!(cuda_rt::is_available());
    println!("the GPU test body ran");
});

cuda_rt::gpu_test!(another_gpu_test_that_skips_without_a_gpu, {
    assert!(cuda_rt::is_available());
});

#[test]
fn the_binary_says_at_exit_how_many_tests_did_not_run() {
    if std::env::var_os("CUDA_RT_SKIP_CHILD").is_some() {
        return;
    }
    // This binary again, running only the two GPU tests above, one at a time, with no
    // device visible (on a machine without a driver they skip anyway).
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "gpu_test_that_skips_without_a_gpu",
            "--nocapture",
            "--test-threads=1",
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
        // CUDA_VISIBLE_DEVICES): nothing skipped.
        assert!(stderr.contains("note: all 2 tests"), "{stderr}");
        return;
    }
    assert!(stdout.contains("2 passed"), "{stdout}");
    // Each test says it skipped, in one line each.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("skipped "))
        .collect();
    assert_eq!(said.len(), 2, "{stderr}");
    assert!(said.iter().all(|l| l.contains(": no GPU")), "{stderr}");
    // The last line is the tally.
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with(
            "note: 0 tests that need a GPU, NVRTC or Chromium ran for real; 2 did not, and \
             libtest counts them as passed: 2 no GPU ("
        ),
        "{stderr}"
    );
    assert!(last.ends_with("Set CUDA_RT_REQUIRE_GPU=1 to make them fail instead."));
}

#[test]
fn the_summary_names_each_reason_and_the_variables_that_forbid_skips() {
    let t = Tally {
        ran: 4,
        skipped: vec![
            (NO_GPU, 25, "no driver".into()),
            (NO_NVRTC, 3, "NVRTC (libnvrtc.so.13) not found ...".into()),
            (NO_CHROMIUM, 1, "no chromium on PATH".into()),
        ],
    };
    assert_eq!(
        skip_summary(&t),
        "note: 4 tests that need a GPU, NVRTC or Chromium ran for real; 29 did not, and \
         libtest counts them as passed: 25 no GPU (no driver), 3 no NVRTC (NVRTC \
         (libnvrtc.so.13) not found ...), 1 no Chromium (no chromium on PATH). Set \
         CUDA_RT_REQUIRE_GPU=1 or CUDA_RT_REQUIRE_CHROMIUM=1 to make them fail instead.\n"
    );
}

#[test]
fn the_summary_of_a_run_without_skips_says_all_ran() {
    let t = Tally {
        ran: 3,
        skipped: Vec::new(),
    };
    assert_eq!(
        skip_summary(&t),
        "note: all 3 tests that need a GPU, NVRTC or Chromium ran for real; none skipped.\n"
    );
}

#[test]
fn a_kind_of_skip_no_variable_forbids_gives_no_hint() {
    let t = Tally {
        ran: 0,
        skipped: vec![("no nvcc", 1, "nvcc is not on PATH".into())],
    };
    let s = skip_summary(&t);
    assert!(s.contains("1 no nvcc (nvcc is not on PATH)."), "{s}");
    assert!(!s.contains("Set "), "{s}");
}

#[test]
fn one_test_that_ran_reads_in_the_singular() {
    let t = Tally {
        ran: 1,
        skipped: Vec::new(),
    };
    assert_eq!(
        skip_summary(&t),
        "note: the 1 test that needs a GPU, NVRTC or Chromium ran for real; none skipped.\n"
    );
}
