//! The `bytemuck` feature: a user's struct that derives `bytemuck::Pod` is a buffer
//! element and a kernel argument by value after `impl BytemuckPod for T {}`, with no
//! `unsafe`. The trait checks and the argument's bytes run anywhere; the buffer round
//! trip and the kernel need a GPU (and NVRTC), and skip without one.

#[path = "common_kernel/mod.rs"]
mod common_kernel;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::compiler::RawKernel;
use cuda_rt::launch::{KernelArg, PlainData};
use cuda_rt::memory::{BytemuckPod, Pod, F16};
use cuda_rt::{gpu_test, LaunchConfig};

/// A user's type as it is written for `bytemuck` (wgpu, glam...), plus the marker.
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Particle {
    position: [f32; 3],
    mass: f32,
}
impl BytemuckPod for Particle {}

/// One holding cuda-rt's half type (which implements bytemuck's traits).
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Tagged {
    value: F16,
    tag: u16,
}
impl BytemuckPod for Tagged {}

fn is_pod<T: Pod>() {}
fn is_plain_data<T: PlainData>() {}

#[test]
fn bytemuck_types_are_pod_and_plain_data_through_the_marker() {
    is_pod::<Particle>();
    is_pod::<[Particle; 2]>();
    is_pod::<Tagged>();
    is_plain_data::<Particle>();
    is_plain_data::<Tagged>();
    // The primitives keep their own impls, beside the marker's.
    is_pod::<f32>();
    is_plain_data::<bool>();
    is_plain_data::<*const f32>();
}

#[test]
fn a_bytemuck_struct_passes_its_own_bytes_by_value() {
    let p = Particle {
        position: [1.0, 2.0, 3.0],
        mass: 4.0,
    };
    assert_eq!(p.param_size(), 16);
    assert_eq!(p.param_ptr() as usize, &p as *const Particle as usize);
    // SAFETY: `param_ptr` points to `param_size` readable bytes while `p` is borrowed.
    let bytes = unsafe { std::slice::from_raw_parts(p.param_ptr().cast::<u8>(), 16) };
    assert_eq!(bytes, bytemuck::bytes_of(&p));
}

gpu_test!(bytemuck_structs_round_trip_through_a_device_buffer, {
    let host: Vec<Particle> = (0..1000)
        .map(|i| Particle {
            position: [i as f32, -(i as f32), 0.5 * i as f32],
            mass: 1.0 + i as f32,
        })
        .collect();
    let buf = DeviceBuffer::from_slice(&host).unwrap();
    assert_eq!(buf.len(), host.len());
    assert_eq!(buf.to_vec().unwrap(), host);
    let tags: Vec<Tagged> = (0..100u16)
        .map(|i| Tagged {
            value: F16::from_f32(f32::from(i) * 0.5),
            tag: i,
        })
        .collect();
    assert_eq!(
        DeviceBuffer::from_slice(&tags).unwrap().to_vec().unwrap(),
        tags
    );
});

gpu_test!(a_kernel_takes_bytemuck_structs_by_pointer_and_by_value, {
    if !common_kernel::nvrtc_or_skip("a_kernel_takes_bytemuck_structs_by_pointer_and_by_value") {
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(
        r#"
struct Particle { float position[3]; float mass; };
extern "C" __global__ void push(Particle* ps, Particle by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        for (int d = 0; d < 3; ++d) ps[i].position[d] += by.position[d];
        ps[i].mass *= by.mass;
    }
}"#,
        "push",
        &[],
    )
    .unwrap();
    let n = 500usize;
    let host: Vec<Particle> = (0..n)
        .map(|i| Particle {
            position: [i as f32, 0.0, -1.0],
            mass: i as f32,
        })
        .collect();
    let mut ps = DeviceBuffer::from_slice(&host).unwrap();
    let by = Particle {
        position: [0.5, 1.0, 2.0],
        mass: 2.0,
    };
    let cfg = LaunchConfig::for_num_elems_with_block(n as u32, 128);
    let len = n as i32;
    // SAFETY: push(Particle* ps, Particle by, int n): ps holds n Particles (the same
    // #[repr(C)] layout) on device 0; `to_vec` reads it after the kernel on the same
    // stream, and nothing else uses it.
    unsafe { cuda_rt::launch!(k, &cfg, (&mut ps, by, len)) }.unwrap();
    let got = ps.to_vec().unwrap();
    for (i, (g, h)) in got.iter().zip(&host).enumerate() {
        let want = Particle {
            position: [
                h.position[0] + 0.5,
                h.position[1] + 1.0,
                h.position[2] + 2.0,
            ],
            mass: h.mass * 2.0,
        };
        assert_eq!(*g, want, "particle {i}");
    }
});
