//! What the device's graph allocator holds: the memory of graphs' allocation nodes
//! (`cuDeviceGetGraphMemAttribute`), and giving back what no graph uses
//! (`cuDeviceGraphMemTrim`).

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::Result;

/// The graph memory of a device, in bytes ([`graph_memory_usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GraphMemoryUsage {
    /// Memory that executable graphs' allocations hold now.
    pub used: u64,
    /// The most `used` was since the process started (or the driver reset it).
    pub used_high: u64,
    /// Memory the graph allocator holds from the device now, in use or cached.
    pub reserved: u64,
    /// The most `reserved` was.
    pub reserved_high: u64,
}

/// The graph memory of `device`: what executable graphs' allocation nodes hold, and
/// what the graph allocator reserves (CUDA's `cudaGraphMemAttr*` figures). An
/// executable that is destroyed (a dropped [`Graph`](super::Graph), an evicted
/// [`Recorder`](super::Recorder) recording) gives its memory back once its launches
/// are done; [`trim_graph_memory`] then returns the cached part to the device.
pub fn graph_memory_usage(device: i32) -> Result<GraphMemoryUsage> {
    make_current(device)?;
    let dev = result::device::get(device)?;
    let get = |a| result::device::get_graph_mem_attribute(dev, a);
    use sys::CUgraphMem_attribute as A;
    Ok(GraphMemoryUsage {
        used: get(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
        used_high: get(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
        reserved: get(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
        reserved_high: get(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
    })
}

/// Gives the graph memory of `device` that no executable graph holds back to the
/// device (`cuDeviceGraphMemTrim`). Graphs launched later map memory again.
pub fn trim_graph_memory(device: i32) -> Result<()> {
    make_current(device)?;
    Ok(result::device::graph_mem_trim(result::device::get(
        device,
    )?)?)
}
