// CUDA forbids calls on one graph from two threads at once (launch may instantiate,
// clone and node listing read it): a `Graph` is `Send` but not `Sync`, so `&Graph`
// cannot be shared across threads.
use cuda_rt::Graph;

fn main() {
    let graph = Graph::new().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| graph.node_count());
        let _ = graph.node_count();
    });
}
