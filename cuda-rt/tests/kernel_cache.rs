//! The kernel cache: disk round trips, corrupt and truncated files, concurrent writers
//! (threads and a second process) run for real with only NVRTC; the memory cache of
//! loaded modules needs a GPU. The folder's trust rules (links, modes, owners, forged
//! entries) are tested through `store`/`load`, with no NVRTC.

#[path = "common_kernel/mod.rs"]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Barrier};

use common::{nvrtc_or_skip, unique, TempDir, SAXPY};
use cuda_rt::compiler::cache::{
    cache_key, checksum, encode, CacheKey, KernelCache, CHECKSUM_LEN, FORMAT_VERSION,
};
use cuda_rt::compiler::nvrtc_facts::nvrtc_facts;
use cuda_rt::compiler::Compiled;
use cuda_rt::compiler::{
    nvrtc_call_count, nvrtc_call_count_on_this_thread, nvrtc_version, Output, Program, RawKernel,
    RawModule, Target,
};

const TARGET: Target = Target::cubin(90);

macro_rules! nvrtc_test {
    ($name:ident, $body:block) => {
        #[test]
        fn $name() {
            if !nvrtc_or_skip(stringify!($name)) {
                return;
            }
            $body
        }
    };
}

fn cache_file(dir: &Path, program: &Program<'_>) -> std::path::PathBuf {
    dir.join(cache_key(program, TARGET, nvrtc_version().unwrap()).file_name())
}

fn all_files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The kernel files (not the NVRTC facts file) in `dir`.
fn files_in(dir: &Path) -> Vec<String> {
    all_files_in(dir)
        .into_iter()
        .filter(|f| !f.ends_with(".facts"))
        .collect()
}

nvrtc_test!(warm_disk_cache_answers_a_new_cache_without_compiling, {
    let dir = TempDir::new("warm");
    let src = unique(SAXPY);
    let exprs = [];
    let p = Program::new(&src).name_expressions(&exprs);
    let first = KernelCache::new(Some(dir.path()));
    let a = first.compile(&p, TARGET).unwrap();
    assert_eq!((first.stats().compiles, first.stats().disk_hits), (1, 0));
    assert!(cache_file(&dir.0, &p).exists());

    // A new cache over the same folder: what a new process sees.
    let second = KernelCache::new(Some(dir.path()));
    let b = second.compile(&p, TARGET).unwrap();
    assert_eq!((second.stats().compiles, second.stats().disk_hits), (0, 1));
    assert_eq!(a, b);
});

nvrtc_test!(lowered_names_and_log_survive_the_disk_round_trip, {
    let dir = TempDir::new("names");
    let src = unique(
        "#warning kept-in-cache\ntemplate <typename T> __global__ void f(T* x) { *x = T(0); }",
    );
    let exprs = ["f<float>", "f<double>"];
    let p = Program::new(&src).name_expressions(&exprs);
    let a = KernelCache::new(Some(dir.path()))
        .compile(&p, TARGET)
        .unwrap();
    let fresh = KernelCache::new(Some(dir.path()));
    let b = fresh.compile(&p, TARGET).unwrap();
    assert_eq!(fresh.stats().compiles, 0);
    assert_eq!(b.lowered_names, a.lowered_names);
    assert!(b
        .lowered_name("f<double>")
        .is_some_and(|n| n.starts_with("_Z")));
    assert!(b.warnings().contains("kept-in-cache"));
});

nvrtc_test!(a_different_option_or_arch_is_a_different_entry, {
    let dir = TempDir::new("keys");
    let src = unique(SAXPY);
    let cache = KernelCache::new(Some(dir.path()));
    cache.compile(&Program::new(&src), TARGET).unwrap();
    cache
        .compile(&Program::new(&src).options(&["-lineinfo"]), TARGET)
        .unwrap();
    cache
        .compile(&Program::new(&src), Target::cubin(80))
        .unwrap();
    cache.compile(&Program::new(&src), Target::ptx(90)).unwrap();
    assert_eq!(cache.stats().compiles, 4);
    assert_eq!(files_in(&dir.0).len(), 4);
});

fn damaged_file_is_a_miss_that_gets_rewritten(damage: impl Fn(&mut Vec<u8>)) {
    let dir = TempDir::new("damage");
    let src = unique(SAXPY);
    let p = Program::new(&src);
    let good = KernelCache::new(Some(dir.path()))
        .compile(&p, TARGET)
        .unwrap();
    let path = cache_file(&dir.0, &p);
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();

    let cache = KernelCache::new(Some(dir.path()));
    let again = cache.compile(&p, TARGET).unwrap();
    assert_eq!(again, good);
    assert_eq!(
        (cache.stats().compiles, cache.stats().corrupt_files),
        (1, 1)
    );
    // Rewritten: a third cache reads it back.
    let key = cache_key(&p, TARGET, nvrtc_version().unwrap());
    assert_eq!(KernelCache::new(Some(dir.path())).load(&key), Some(good));
    let third = KernelCache::new(Some(dir.path()));
    third.compile(&p, TARGET).unwrap();
    assert_eq!(third.stats().compiles, 0);
}

nvrtc_test!(truncated_cache_file_is_a_miss_that_gets_rewritten, {
    damaged_file_is_a_miss_that_gets_rewritten(|b| b.truncate(b.len() / 2));
});

nvrtc_test!(corrupt_cache_file_is_a_miss_that_gets_rewritten, {
    damaged_file_is_a_miss_that_gets_rewritten(|b| {
        let mid = b.len() / 2;
        b[mid] ^= 0xff;
    });
});

nvrtc_test!(empty_cache_file_is_a_miss_that_gets_rewritten, {
    damaged_file_is_a_miss_that_gets_rewritten(Vec::clear);
});

nvrtc_test!(garbage_cache_file_is_a_miss_that_gets_rewritten, {
    damaged_file_is_a_miss_that_gets_rewritten(|b| {
        *b = b"not a cache file at all, just text".repeat(20);
    });
});

nvrtc_test!(memory_only_cache_writes_no_file, {
    let dir = TempDir::new("memonly");
    let cache = KernelCache::new(Some(dir.path()));
    cache.set_disk_dir(None);
    assert_eq!(cache.disk_dir(), None);
    cache
        .compile(&Program::new(&unique(SAXPY)), TARGET)
        .unwrap();
    assert!(files_in(&dir.0).is_empty());
});

nvrtc_test!(unwritable_cache_folder_still_compiles, {
    let dir = TempDir::new("unwritable");
    let file = dir.0.join("a-file-not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let cache = KernelCache::new(Some(file.join("kernels")));
    cache
        .compile(&Program::new(&unique(SAXPY)), TARGET)
        .unwrap();
    assert_eq!(cache.stats().compiles, 1);
    // The folder cannot be made: the cache is in memory only, and says so.
    assert!(cache.memory_only_reason().is_some());
    assert_eq!(cache.stats().disk_write_failures, 0);
});

nvrtc_test!(concurrent_writers_on_one_key_leave_one_valid_file, {
    let dir = TempDir::new("threads");
    let src = unique(SAXPY);
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (dir, src, barrier) = (dir.path(), src.clone(), barrier.clone());
            std::thread::spawn(move || {
                let cache = KernelCache::new(Some(dir));
                barrier.wait();
                cache.compile(&Program::new(&src), TARGET).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    let p = Program::new(&src);
    assert_eq!(
        files_in(&dir.0),
        [cache_file(&dir.0, &p)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()]
    );
    let key = cache_key(&p, TARGET, nvrtc_version().unwrap());
    assert_eq!(
        KernelCache::new(Some(dir.path())).load(&key).as_ref(),
        Some(&results[0])
    );
});

const CHILD_DIR_VAR: &str = "CUDA_RT_TEST_RACE_DIR";
const CHILD_SRC_VAR: &str = "CUDA_RT_TEST_RACE_SRC";

/// Not a test of its own: the body of the child processes of
/// `two_processes_racing_on_one_key_agree`, a no-op unless that test starts it.
#[test]
fn race_child_process() {
    let (Ok(dir), Ok(src)) = (std::env::var(CHILD_DIR_VAR), std::env::var(CHILD_SRC_VAR)) else {
        return;
    };
    let cache = KernelCache::new(Some(dir.into()));
    for _ in 0..5 {
        cache.compile(&Program::new(&src), TARGET).unwrap();
    }
}

nvrtc_test!(two_processes_racing_on_one_key_agree, {
    let dir = TempDir::new("procs");
    let src = unique(SAXPY);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "race_child_process", "--test-threads=1"])
                .env(CHILD_DIR_VAR, dir.path())
                .env(CHILD_SRC_VAR, &src)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let cache = KernelCache::new(Some(dir.path()));
    let mine = cache.compile(&Program::new(&src), TARGET).unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child process failed");
    }
    let after = KernelCache::new(Some(dir.path()));
    assert_eq!(after.compile(&Program::new(&src), TARGET).unwrap(), mine);
    assert_eq!(after.stats().compiles, 0);
    let leftovers: Vec<_> = all_files_in(&dir.0)
        .into_iter()
        .filter(|f| f.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
});

const WARM_DIR_VAR: &str = "CUDA_RT_TEST_WARM_DIR";
const WARM_SRC_VAR: &str = "CUDA_RT_TEST_WARM_SRC";

/// Not a test of its own: the body of the child process of
/// `warm_disk_cache_in_a_new_process_makes_no_nvrtc_call`, a no-op unless that test
/// starts it. Prints `nvrtc-calls=N hits=H compiles=C micros=T`.
#[test]
fn warm_child_process() {
    let (Ok(dir), Ok(src)) = (std::env::var(WARM_DIR_VAR), std::env::var(WARM_SRC_VAR)) else {
        return;
    };
    let before = nvrtc_call_count();
    let t = std::time::Instant::now();
    let cache = KernelCache::new(Some(dir.into()));
    let c = cache.compile(&Program::new(&src), TARGET).unwrap();
    let micros = t.elapsed().as_micros();
    assert!(!c.image.is_empty());
    println!(
        "nvrtc-calls={} hits={} compiles={} micros={micros}",
        nvrtc_call_count() - before,
        cache.stats().disk_hits,
        cache.stats().compiles
    );
}

fn run_warm_child(dir: &Path, src: &str) -> (u64, u64, u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "warm_child_process",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(WARM_DIR_VAR, dir)
        .env(WARM_SRC_VAR, src)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {text}");
    // libtest prints `test warm_child_process ... ` on the same line first.
    let line = text
        .lines()
        .find_map(|l| l.find("nvrtc-calls=").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no report from the child: {text}"));
    let n: Vec<u64> = line
        .split(' ')
        .map(|f| f.split('=').nth(1).unwrap().parse().unwrap())
        .collect();
    (n[0], n[1], n[2], n[3])
}

nvrtc_test!(warm_disk_cache_in_a_new_process_makes_no_nvrtc_call, {
    let dir = TempDir::new("warm-proc");
    let src = unique(SAXPY);
    // Cold: this process compiles, and records NVRTC's facts beside the kernel.
    let cold = KernelCache::new(Some(dir.path()));
    cold.compile(&Program::new(&src), TARGET).unwrap();
    assert_eq!(cold.stats().compiles, 1);
    let facts: Vec<_> = all_files_in(&dir.0)
        .into_iter()
        .filter(|f| f.ends_with(".facts"))
        .collect();
    if facts.is_empty() {
        // The loader would find libnvrtc by bare name through ld.so.cache: its file
        // cannot be told without opening it, so NVRTC is asked (still correct).
        cuda_rt::testing::skip(
            "warm_disk_cache_in_a_new_process_makes_no_nvrtc_call",
            "libnvrtc found by bare name",
            &"libnvrtc's file cannot be identified without opening it",
        );
        return;
    }
    // A new process, warm folder: a disk hit with no NVRTC call at all.
    let (calls, hits, compiles, micros) = run_warm_child(&dir.0, &src);
    eprintln!("warm first use in a new process: {micros} us");
    assert_eq!((hits, compiles), (1, 0));
    assert_eq!(calls, 0, "a warm hit called NVRTC");
    // Without the facts file the child must ask NVRTC (and still hits the disk).
    for f in &facts {
        std::fs::remove_file(dir.0.join(f)).unwrap();
    }
    let (calls, hits, compiles, _) = run_warm_child(&dir.0, &src);
    assert_eq!((hits, compiles), (1, 0));
    assert!(calls > 0, "no facts file, yet NVRTC was not asked");
    // ... and it wrote the facts back, so the next process is silent again.
    let (calls, hits, _, _) = run_warm_child(&dir.0, &src);
    assert_eq!((calls, hits), (0, 1));
    // A corrupt facts file is ignored: NVRTC is asked, the answer is right.
    let name = all_files_in(&dir.0)
        .into_iter()
        .find(|f| f.ends_with(".facts"))
        .unwrap();
    std::fs::write(dir.0.join(&name), b"garbage").unwrap();
    let (calls, hits, compiles, _) = run_warm_child(&dir.0, &src);
    assert!(calls > 0);
    assert_eq!((hits, compiles), (1, 0));
});

nvrtc_test!(facts_match_what_nvrtc_says, {
    let dir = TempDir::new("facts");
    let f = nvrtc_facts(Some(&dir.0)).unwrap();
    assert_eq!(f.version, nvrtc_version().unwrap());
    assert_eq!(f.archs, cuda_rt::compiler::supported_archs().unwrap());
    // Once known, a warm hit in this process makes no NVRTC call either.
    let src = unique(SAXPY);
    KernelCache::new(Some(dir.path()))
        .compile(&Program::new(&src), TARGET)
        .unwrap();
    // Other tests compile on other threads meanwhile: count this thread's calls only.
    let before = nvrtc_call_count_on_this_thread();
    let warm = KernelCache::new(Some(dir.path()));
    warm.compile(&Program::new(&src), TARGET).unwrap();
    assert_eq!(warm.stats().disk_hits, 1);
    assert_eq!(nvrtc_call_count_on_this_thread(), before);
});

cuda_rt::gpu_test!(
    second_raw_module_of_the_same_source_compiles_and_loads_nothing,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let dir = TempDir::new("gpu-mem");
        let cache = KernelCache::new(Some(dir.path()));
        let src = unique(SAXPY);
        let p = Program::new(&src);
        let a = RawModule::from_program(&p, Output::Cubin, &cache).unwrap();
        let b = RawModule::from_program(&p, Output::Cubin, &cache).unwrap();
        assert_eq!(cache.stats().compiles, 1);
        assert_eq!(cache.stats().memory_hits, 1);
        assert!(a.same_module(&b), "one module load");
        // A new cache (a new process) reads the disk, compiles nothing, loads once.
        let other = KernelCache::new(Some(dir.path()));
        let c = RawModule::from_program(&p, Output::Cubin, &other).unwrap();
        assert_eq!((other.stats().compiles, other.stats().disk_hits), (0, 1));
        assert!(!c.same_module(&a));
    }
);

cuda_rt::gpu_test!(
    second_raw_kernel_through_the_global_cache_reuses_the_module,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let src = unique(SAXPY);
        let global = KernelCache::global();
        let a = RawKernel::new(&src, "saxpy", &[]).unwrap();
        let compiles = global.stats().compiles;
        let b = RawKernel::new(&src, "saxpy", &[]).unwrap();
        assert_eq!(global.stats().compiles, compiles);
        assert!(a.raw_module().same_module(b.raw_module()));
        assert_eq!(a.as_raw(), b.as_raw());
    }
);

// ---- The folder's trust rules, through store/load: no NVRTC needed. ----

fn fake_compiled(tag: &str) -> Compiled {
    Compiled {
        image: format!("\x7fELF fake cubin {tag}").into_bytes(),
        output: Output::Cubin,
        arch: 90,
        log: String::new(),
        lowered_names: vec![("k<int>".into(), "_Z1kIiEvv".into())],
    }
}

/// A folder of this user's, mode 0700 (what the cache itself would create).
fn private_dir(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    assert_eq!(std::fs::metadata(&dir.0).unwrap().mode() & 0o777, 0o700);
    dir
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn stored_entry_is_read_back_by_a_new_cache() {
    let dir = private_dir("store");
    let key = CacheKey([1; 16]);
    let c = fake_compiled("a");
    let first = KernelCache::new(Some(dir.path()));
    assert_eq!(first.memory_only_reason(), None);
    first.store(&key, &c).unwrap();
    let second = KernelCache::new(Some(dir.path()));
    assert_eq!(second.load(&key), Some(c));
    assert_eq!(second.stats().disk_hits, 1);
    assert_eq!(second.load(&CacheKey([2; 16])), None);
    // Entries are private to the user, and they are all the cache writes.
    let mode = std::fs::metadata(dir.0.join(key.file_name()))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(all_files_in(&dir.0), [key.file_name()]);
}

#[test]
fn missing_cache_folder_is_created_mode_0700() {
    let dir = TempDir::new("create");
    let kernels = dir.0.join("cuda-rt").join("kernels");
    let cache = KernelCache::new(Some(kernels.clone()));
    assert_eq!(cache.disk_dir(), Some(kernels.clone()));
    for p in [kernels.parent().unwrap(), &kernels] {
        assert_eq!(std::fs::metadata(p).unwrap().mode() & 0o777, 0o700);
    }
}

#[test]
fn link_planted_at_an_entry_name_is_not_followed_on_read_or_write() {
    let dir = private_dir("entry-link");
    let key = CacheKey([3; 16]);
    let entry = dir.0.join(key.file_name());
    let cache = KernelCache::new(Some(dir.path()));
    // A valid entry for `key`, moved aside and linked back: the content would pass,
    // so only the link is what refuses it.
    cache.store(&key, &fake_compiled("linked")).unwrap();
    let aside = dir.0.join("aside");
    std::fs::rename(&entry, &aside).unwrap();
    std::os::unix::fs::symlink(&aside, &entry).unwrap();
    assert_eq!(cache.load(&key), None);
    assert_eq!(cache.stats().corrupt_files, 1);
    // A link to a file of the user's elsewhere: a write replaces the link, and the
    // file it pointed to is untouched.
    let victim = TempDir::new("victim");
    let victim_file = victim.0.join("precious");
    std::fs::write(&victim_file, b"precious").unwrap();
    std::fs::remove_file(&entry).unwrap();
    std::os::unix::fs::symlink(&victim_file, &entry).unwrap();
    let c = fake_compiled("real");
    cache.store(&key, &c).unwrap();
    assert_eq!(std::fs::read(&victim_file).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&entry).unwrap().is_file());
    assert_eq!(cache.load(&key), Some(c));
}

/// A cache over `dir`, checked to be refused: memory only, with a reason containing
/// `why`, no disk folder, and nothing written into `dir`.
fn assert_refused(dir: &Path, why: &str) {
    let before = all_files_in(dir);
    let cache = KernelCache::new(Some(dir.to_path_buf()));
    let reason = cache.memory_only_reason().expect("the folder is refused");
    assert!(reason.contains(why), "{reason}");
    assert!(reason.contains(&dir.display().to_string()), "{reason}");
    assert_eq!(cache.disk_dir(), None);
    let key = CacheKey([4; 16]);
    let err = cache.store(&key, &fake_compiled("x")).unwrap_err();
    assert_eq!(err.to_string(), reason);
    assert_eq!(cache.load(&key), None);
    assert_eq!(all_files_in(dir), before, "a refused folder was written to");
    // The debug form names the refusal too.
    let debug = format!("{cache:?}");
    assert!(debug.contains("is not trusted"), "{debug}");
}

#[test]
fn folder_writable_by_others_is_refused_and_left_untouched() {
    let dir = TempDir::new("mode-777");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(&dir.0, "is writable by group or others (mode 777)");
}

#[test]
fn folder_writable_by_its_group_is_refused() {
    let dir = TempDir::new("mode-770");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o770)).unwrap();
    assert_refused(&dir.0, "is writable by group or others (mode 770)");
}

#[test]
fn folder_owned_by_another_user_is_refused() {
    if euid() == 0 {
        // Root can give a folder away: to a user id nobody has.
        let dir = private_dir("foreign");
        std::os::unix::fs::chown(&dir.0, Some(4242), Some(4242)).unwrap();
        assert_refused(&dir.0, "is owned by user 4242, not by this user (0)");
    } else {
        // Not root: `/` is root's.
        let reason = KernelCache::new(Some("/".into()))
            .memory_only_reason()
            .expect("/ is refused");
        assert!(reason.contains("is owned by user 0"), "{reason}");
    }
}

#[test]
fn cache_folder_that_cannot_be_created_leaves_the_cache_in_memory() {
    let dir = TempDir::new("not-a-folder");
    let file = dir.0.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cache = KernelCache::new(Some(file.join("kernels")));
    let reason = cache.memory_only_reason().unwrap();
    assert!(reason.contains("cannot be created"), "{reason}");
    assert!(cache
        .store(&CacheKey([5; 16]), &fake_compiled("x"))
        .is_err());
}

#[test]
fn cache_without_a_folder_says_it_is_in_memory_only() {
    let reason = KernelCache::new(None).memory_only_reason().unwrap();
    assert!(reason.contains("no disk folder is configured"), "{reason}");
}

/// The header and payload of `compiled`'s entry (the layout every format shares),
/// marked as format `version`, without what ends it.
fn body_of_format(version: u32, key: &CacheKey, compiled: &Compiled) -> Vec<u8> {
    let v5 = encode(key, compiled);
    let mut out = v5[..v5.len() - CHECKSUM_LEN].to_vec();
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out
}

/// `compiled` as format 1 wrote it: header and payload, then an FNV-1a checksum.
fn format_1_entry(key: &CacheKey, compiled: &Compiled) -> Vec<u8> {
    let mut out = body_of_format(1, key, compiled);
    out.extend_from_slice(&fnv1a_128(&out));
    out
}

/// FNV-1a, 128 bits, big-endian: format 1's checksum (the cache itself no longer has
/// it).
fn fnv1a_128(bytes: &[u8]) -> [u8; 16] {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let h = bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    h.to_be_bytes()
}

/// `compiled` as format 4 wrote it in a folder whose `kcache.secret` held `secret`:
/// header and payload, then BLAKE3 keyed with a key derived from the secret over the
/// entry padded with zeros and its length to whole 8 KiB batches.
fn format_4_entry(key: &CacheKey, compiled: &Compiled, secret: &[u8; 32]) -> Vec<u8> {
    let mut out = body_of_format(4, key, compiled);
    let tag_key = blake3::keyed_hash(secret, b"cuda-rt kernel cache entry v4\0");
    let mut message = out.clone();
    message.resize((out.len() + 8).next_multiple_of(8 << 10) - 8, 0);
    message.extend_from_slice(&(out.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::keyed_hash(tag_key.as_bytes(), &message).as_bytes());
    out
}

/// What an upgrade meets: entries that earlier formats accepted (format 4's with the
/// folder's secret still beside them, format 1's with a checksum that matches) are
/// misses, and what is compiled next overwrites them.
#[test]
fn entries_of_earlier_formats_are_misses_and_get_overwritten() {
    let dir = private_dir("earlier-formats");
    let key = CacheKey([6; 16]);
    let entry = dir.0.join(key.file_name());
    let secret = [0x5a; 32];
    std::fs::write(dir.0.join("kcache.secret"), secret).unwrap();
    std::fs::set_permissions(
        dir.0.join("kcache.secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let cache = KernelCache::new(Some(dir.path()));
    assert_eq!(cache.memory_only_reason(), None);
    let old = fake_compiled("kept from before");
    assert_eq!(FORMAT_VERSION, 5);
    for (n, bytes) in [
        format_1_entry(&key, &old),
        format_4_entry(&key, &old, &secret),
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&entry, bytes).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(cache.load(&key), None);
        assert_eq!(cache.stats().corrupt_files, n as u64 + 1);
    }
    let real = fake_compiled("compiled now");
    cache.store(&key, &real).unwrap();
    assert_eq!(KernelCache::new(Some(dir.path())).load(&key), Some(real));
}

/// Format 5's checksum catches damage, not intent: an entry whose checksum does not
/// match is a miss; one the user wrote whole, by hand or with another tool, in their
/// own folder and with its checksum, is read as the cache's own (the folder's owner is
/// trusted: see the cache's module docs).
#[test]
fn the_checksum_tells_a_damaged_entry_from_a_whole_one() {
    let dir = private_dir("checksum");
    let key = CacheKey([9; 16]);
    let entry = dir.0.join(key.file_name());
    let cache = KernelCache::new(Some(dir.path()));
    let c = fake_compiled("whole");
    let mut bytes = encode(&key, &c);
    let n = bytes.len();
    assert_eq!(
        bytes[n - CHECKSUM_LEN..],
        checksum(&bytes[..n - CHECKSUM_LEN])
    );
    bytes[n - CHECKSUM_LEN - 1] ^= 0x40;
    std::fs::write(&entry, &bytes).unwrap();
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(cache.load(&key), None);
    assert_eq!(cache.stats().corrupt_files, 1);
    std::fs::write(&entry, encode(&key, &c)).unwrap();
    assert_eq!(cache.load(&key), Some(c));
}

#[test]
fn entry_writable_by_others_is_a_miss() {
    let dir = private_dir("entry-mode");
    let key = CacheKey([7; 16]);
    let cache = KernelCache::new(Some(dir.path()));
    let c = fake_compiled("a");
    cache.store(&key, &c).unwrap();
    let entry = dir.0.join(key.file_name());
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(cache.load(&key), None);
    cache.store(&key, &c).unwrap();
    assert_eq!(cache.load(&key), Some(c));
}

/// Format 4's secret file, left by an earlier version, is neither read nor needed: one
/// that the earlier version refused (readable by others) no longer turns the disk
/// part off, and it is left as it was.
#[test]
fn a_secret_left_by_an_earlier_version_is_ignored() {
    let dir = private_dir("secret-left");
    let secret = dir.0.join("kcache.secret");
    std::fs::write(&secret, [1u8; 32]).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cache = KernelCache::new(Some(dir.path()));
    assert_eq!(cache.memory_only_reason(), None);
    let key = CacheKey([10; 16]);
    cache.store(&key, &fake_compiled("a")).unwrap();
    assert_eq!(
        KernelCache::new(Some(dir.path())).load(&key),
        Some(fake_compiled("a"))
    );
    assert_eq!(std::fs::read(&secret).unwrap(), [1u8; 32]);
}

/// What is checked once per cache and what again: a cache checks its folder on first
/// use and keeps the answer; a new cache on the same folder checks it again (this
/// process having used it changes nothing), so a folder that became writable
/// by others is refused from then on.
#[test]
fn folder_made_writable_by_others_after_first_use_is_refused_by_a_new_cache() {
    let dir = private_dir("mode-after");
    let key = CacheKey([8; 16]);
    let first = KernelCache::new(Some(dir.path()));
    first.store(&key, &fake_compiled("a")).unwrap();
    assert_eq!(
        KernelCache::new(Some(dir.path())).load(&key),
        Some(fake_compiled("a"))
    );
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let later = KernelCache::new(Some(dir.path()));
    assert_eq!(later.load(&key), None);
    let reason = later.memory_only_reason().unwrap();
    assert!(reason.contains("writable by group or others"), "{reason}");
    // The cache that checked the folder before keeps using it.
    assert_eq!(first.disk_dir(), Some(dir.path()));
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
}
