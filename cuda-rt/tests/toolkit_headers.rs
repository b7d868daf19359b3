//! Kernels that include the toolkit's own headers: cooperative groups, CUB and
//! libcu++ (`cuda::std`). NVRTC gets the include folders of the CUDA toolkit and of
//! CCCL by itself (`cuda_rt::compiler::toolkit`). The compiles run wherever NVRTC and
//! the headers are (a toolkit, or the `nvidia-cuda-runtime` and `nvidia-cuda-cccl`
//! wheels); the GPU tests run what was compiled.

#[path = "common_kernel/mod.rs"]
mod common;

use common::{nvrtc_or_skip, DevBuf};
use cuda_rt::compiler::toolkit::toolkit_includes;
use cuda_rt::compiler::{Program, RawKernel, Target};
use cuda_rt::{LaunchConfig, Stream};

/// Every block writes its partial sum, the grid synchronises (`grid.sync()`), then
/// every block adds all partials: each block's total is right only if no block read
/// the partials before all were written.
const COOP_GRID_SUM: &str = r#"
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void coop_grid_sum(const int* in, int* partial, int* out, int n) {
    cg::grid_group grid = cg::this_grid();
    __shared__ int block_sum;
    if (threadIdx.x == 0) block_sum = 0;
    __syncthreads();
    int v = 0;
    for (unsigned long long i = grid.thread_rank(); i < (unsigned long long)n; i += grid.size())
        v += in[i];
    atomicAdd(&block_sum, v);
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = block_sum;
    grid.sync();
    if (threadIdx.x == 0) {
        int t = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) t += ((volatile int*)partial)[b];
        out[blockIdx.x] = t;
    }
}
"#;

/// One CUB block reduction per block of 128 ints. NVRTC takes CUB's block- and
/// warp-level headers; `<cub/cub.cuh>` also pulls in the host-side device algorithms,
/// which NVRTC refuses ("not allowed in JIT mode", and no `<cstdint>`).
const CUB_BLOCK_SUM: &str = r#"
#include <cub/block/block_reduce.cuh>

extern "C" __global__ void cub_block_sum(const int* in, int* out) {
    using Reduce = cub::BlockReduce<int, 128>;
    __shared__ typename Reduce::TempStorage tmp;
    int v = in[blockIdx.x * 128 + threadIdx.x];
    int s = Reduce(tmp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"#;

/// `cuda::std` types in device code: an array, its range-for, numeric_limits.
const CUDA_STD: &str = r#"
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/cstdint>

extern "C" __global__ void cuda_std_facts(long long* out) {
    cuda::std::array<cuda::std::int32_t, 4> a{1, 2, 3, 4};
    long long s = 0;
    for (auto v : a) s += v;
    out[0] = s;
    out[1] = cuda::std::numeric_limits<int>::max();
    out[2] = cuda::std::numeric_limits<cuda::std::uint8_t>::max();
    out[3] = (long long)a.size();
}
"#;

/// `true` when NVRTC loads and the toolkit headers were found; otherwise prints why
/// `name` is skipped, or panics under `CUDA_RT_REQUIRE_GPU=1` (the GPU machine has a
/// toolkit).
fn headers_or_skip(name: &str, header: &str) -> bool {
    if !nvrtc_or_skip(name) {
        return false;
    }
    // The NVRTC wheel alone brings an include folder without the toolkit's headers:
    // the test needs the very header it includes (from a toolkit, or the
    // `nvidia-cuda-runtime` / `nvidia-cuda-cccl` wheels).
    let has = |set: &cuda_rt::compiler::toolkit::IncludeSet| {
        header.is_empty() || set.dirs.iter().any(|d| d.join(header).exists())
    };
    if toolkit_includes().is_some_and(has) {
        cuda_rt::testing::ran(name);
        return true;
    }
    let searched = cuda_rt::compiler::toolkit::toolkit_search().describe();
    if cuda_rt::testing::gpu_required() {
        panic!(
            "{name}: CUDA_RT_REQUIRE_GPU is set but no toolkit headers with {header:?} were \
             found in {searched}"
        );
    }
    cuda_rt::testing::skip(
        name,
        cuda_rt::testing::NO_CUDA_HEADERS,
        // The places on a line of their own: the closing line takes the first only.
        &format!(
            "no toolkit headers with {header:?} found (pip install nvidia-cuda-runtime \
             nvidia-cuda-cccl brings them)\n  searched {searched}"
        ),
    );
    false
}

macro_rules! headers_test {
    ($name:ident, $header:expr, $body:block) => {
        #[test]
        fn $name() {
            if !headers_or_skip(stringify!($name), $header) {
                return;
            }
            $body
        }
    };
}

headers_test!(
    cooperative_groups_kernel_compiles_with_the_toolkit_headers,
    "cooperative_groups.h",
    {
        let c = Program::new(COOP_GRID_SUM)
            .compile(Target::ptx(90))
            .unwrap();
        let ptx = String::from_utf8_lossy(&c.image);
        assert!(ptx.contains(".entry coop_grid_sum"), "{ptx}");
    }
);

headers_test!(
    cub_block_reduce_compiles_with_the_cccl_headers,
    "cub/block/block_reduce.cuh",
    {
        let c = Program::new(CUB_BLOCK_SUM)
            .compile(Target::ptx(90))
            .unwrap();
        assert!(String::from_utf8_lossy(&c.image).contains(".entry cub_block_sum"));
    }
);

headers_test!(
    cuda_std_types_compile_with_the_cccl_headers,
    "cuda/std/array",
    {
        let c = Program::new(CUDA_STD).compile(Target::ptx(90)).unwrap();
        assert!(String::from_utf8_lossy(&c.image).contains(".entry cuda_std_facts"));
    }
);

headers_test!(without_the_toolkit_folders_the_headers_are_not_found, "", {
    let e = Program::new(CUDA_STD)
        .toolkit_includes(false)
        .compile(Target::ptx(90))
        .unwrap_err();
    assert!(e.to_string().contains("cuda/std/array"), "{e}");
});

headers_test!(a_users_include_folder_wins_over_the_toolkits, "", {
    // A folder of the user's with its own <cuda/std/array>: NVRTC finds it first.
    let dir = common::TempDir::new("user-include");
    let std_dir = dir.path().join("cuda").join("std");
    std::fs::create_dir_all(&std_dir).unwrap();
    std::fs::write(std_dir.join("array"), "#define USERS_OWN_ARRAY_HEADER 1\n").unwrap();
    let src = r#"
#include <cuda/std/array>
#ifndef USERS_OWN_ARRAY_HEADER
#error "the toolkit's header was found before the user's"
#endif
extern "C" __global__ void k() {}
"#;
    let opt = format!("-I{}", dir.path().display());
    Program::new(src)
        .options(&[&opt])
        .compile(Target::ptx(90))
        .unwrap();
});

/// Like `cuda_rt::gpu_test!`, also needing the headers.
macro_rules! gpu_headers_test {
    ($name:ident, $header:expr, $body:block) => {
        cuda_rt::gpu_test!($name, {
            if !headers_or_skip(stringify!($name), $header) {
                return;
            }
            $body
        });
    };
}

gpu_headers_test!(
    cooperative_groups_grid_sync_sums_across_the_grid,
    "cooperative_groups.h",
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let k = RawKernel::new(COOP_GRID_SUM, "coop_grid_sum", &[]).unwrap();
        let cfg1 = LaunchConfig::new(1, 256);
        let max = k.function().max_cooperative_grid(&cfg1).unwrap();
        let blocks = (max as u32).clamp(1, 2 * 132);
        let n = 1_000_003usize;
        let data: Vec<i32> = (0..n).map(|i| (i % 7) as i32 - 3).collect();
        let want: i32 = data.iter().sum();
        let input = DevBuf::from_slice(&data);
        let partial = DevBuf::new(4 * blocks as usize);
        let out = DevBuf::new(4 * blocks as usize);
        let stream = Stream::new().unwrap();
        // SAFETY: coop_grid_sum(const int* in, int* partial, int* out, int n): input holds n
        // ints, partial and out one int per block; all outlive the synchronize below.
        unsafe {
            k.launch_cooperative(
                &stream,
                &LaunchConfig::new(blocks, 256),
                &[&input.ptr, &partial.ptr, &out.ptr, &(n as i32)],
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        let got = out.read::<i32>(blocks as usize);
        assert!(
            got.iter().all(|&t| t == want),
            "every block's total is {want}: {got:?}"
        );
    }
);

gpu_headers_test!(
    cub_block_reduce_sums_each_block,
    "cub/block/block_reduce.cuh",
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let k = RawKernel::new(CUB_BLOCK_SUM, "cub_block_sum", &[]).unwrap();
        let blocks = 64usize;
        let data: Vec<i32> = (0..blocks * 128)
            .map(|i| (i as i32 * 37) % 101 - 50)
            .collect();
        let input = DevBuf::from_slice(&data);
        let out = DevBuf::new(4 * blocks);
        // SAFETY: cub_block_sum(const int* in, int* out): blocks of 128 threads; input holds
        // 128 ints per block, out one; read back by a synchronous copy.
        unsafe {
            k.launch(
                &LaunchConfig::new(blocks as u32, 128),
                &[&input.ptr, &out.ptr],
            )
        }
        .unwrap();
        let want: Vec<i32> = data.chunks(128).map(|c| c.iter().sum()).collect();
        assert_eq!(out.read::<i32>(blocks), want);
    }
);

gpu_headers_test!(
    cuda_std_array_and_numeric_limits_run_on_the_device,
    "cuda/std/array",
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let k = RawKernel::new(CUDA_STD, "cuda_std_facts", &[]).unwrap();
        let out = DevBuf::new(8 * 4);
        // SAFETY: cuda_std_facts(long long* out): out holds the 4 values it writes; read
        // back by a synchronous copy.
        unsafe { k.launch(&LaunchConfig::new(1, 1), &[&out.ptr]) }.unwrap();
        assert_eq!(
            out.read::<i64>(4),
            [10, i64::from(i32::MAX), i64::from(u8::MAX), 4]
        );
    }
);
