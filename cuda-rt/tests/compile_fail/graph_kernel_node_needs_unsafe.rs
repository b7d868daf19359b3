// A kernel node runs arbitrary device code with caller-chosen arguments on every
// launch of the graph: adding one is `unsafe`, as a kernel launch is.
use cuda_rt::graph::{KernelArgs, LaunchConfig};
use cuda_rt::{Graph, Module};

fn main() {
    let module = Module::load_file("kernels.cubin").unwrap();
    let f = module.get_function("scale").unwrap();
    let graph = Graph::new().unwrap();
    let mut args = KernelArgs::new();
    args.push(0xdead_beef_u64); // any address
    let _ = graph.add_kernel_node(&[], &f, LaunchConfig::new(1, 1), &args);
}
