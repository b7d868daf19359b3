// A graph node borrows its graph: it cannot be used once the graph is dropped (its
// handle would name a destroyed node).
use cuda_rt::Graph;

fn main() {
    let node = {
        let graph = Graph::new().unwrap();
        graph.add_empty_node(&[]).unwrap()
    };
    let _ = node.node_type();
}
