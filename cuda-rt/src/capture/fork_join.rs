//! Frees captured on a forked stream, joined back at the capture's end.
//!
//! A block allocated during a capture is freed inside the graph when its last pointer
//! drops, on the current stream (see [`crate::memory::graph_memory`]). On a stream
//! forked into the capture that free is a node after whatever the stream did last,
//! often after the event that joined the fork back into the origin stream: a
//! temporary going out of scope at the end of the fork's block. CUDA would then end
//! the capture with `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`, although the free orders
//! nothing and nothing waits for it.
//!
//! So each free captured on a stream other than the capture's origin is noted with
//! what it came after (the forked stream's frontier just before it) and its node (the
//! frontier just after). Just before `cuStreamEndCapture`, a noted free is joined
//! into the origin's frontier (`cuStreamUpdateCaptureDependencies`, which joins as an
//! event wait would) when it is a leaf of the graph and everything it came after is
//! joined already: an ancestor of the origin's frontier, or such a free itself. Other
//! work left unjoined on a fork (a kernel after the join, or a fork never joined)
//! still makes `end_capture` fail, as CUDA says. The frees stay where they were
//! captured, so the driver may still reuse their memory for allocations ordered after
//! them.

use std::collections::HashSet;

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::{captures, info, CaptureStatus};
use crate::stream::{AsStream, StreamRef};

/// A free node captured on a forked stream (graph nodes as addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SideFree {
    /// The free's node.
    pub(crate) node: usize,
    /// The forked stream's frontier just before the free: what it came after.
    pub(crate) after: Vec<usize>,
}

fn addrs(nodes: Vec<sys::CUgraphNode>) -> Vec<usize> {
    nodes.into_iter().map(|n| n as usize).collect()
}

/// Frees `ptr`, an allocation of the capture `id`, inside the graph on `s` when `s` is
/// in that capture now, after the captured nodes `uses` (the work that used it on
/// any stream of the capture, joined or not); `false` (nothing done) when it is not
/// or the driver refuses.
/// The check and the free run under the lock [`end`](super::end) holds while it ends
/// a capture, so the capture cannot end in between; a free on a stream other than the
/// origin is noted to be joined at the end (see the module docs).
pub(crate) fn free_in_capture(s: &StreamRef, id: u64, ptr: u64, uses: &[usize]) -> bool {
    let mut c = captures();
    let now = matches!(info(s), Ok((CaptureStatus::Active { id: c }, _)) if c == id);
    if !now {
        return false;
    }
    let device = s.device_id();
    let fork = c
        .entries
        .iter()
        .any(|e| e.id == id && !e.began_on(s.handle(), device));
    if !uses.is_empty() {
        let nodes: Vec<sys::CUgraphNode> = uses.iter().map(|&n| n as sys::CUgraphNode).collect();
        // SAFETY: `s` is live and in the capture `id` (above, under the lock); `nodes`
        // are nodes of that capture's graph (noted by `enqueue_using` while it was
        // under way). Refused, the free is not made: nothing may race the next owner.
        if unsafe { result::stream::add_capture_dependencies(s.as_raw(), &nodes) }.is_err() {
            return false;
        }
    }
    // SAFETY (the three calls): `s` is a live stream (kept by the `StreamRef`) in the
    // capture `id`, which cannot end meanwhile (the lock is held); `info` made its
    // context current. The caller hands over a block allocated in this capture, freed
    // once (its last pointer is gone).
    let after = if fork {
        // SAFETY: see above.
        unsafe { result::stream::get_capture_dependencies(s.as_raw()) }.map(addrs)
    } else {
        Ok(Vec::new())
    };
    // SAFETY: as above; the block is freed once, here.
    if unsafe { result::memory::free_async(ptr, s.as_raw()) }.is_err() {
        return false;
    }
    if !fork {
        return true;
    }
    // SAFETY: as above (the lock is still held).
    let node = unsafe { result::stream::get_capture_dependencies(s.as_raw()) }.map(addrs);
    if let (Ok(after), Ok(node)) = (after, node) {
        if let (Some(e), [node]) = (
            c.entries
                .iter_mut()
                .find(|e| e.id == id && e.device == device),
            node.as_slice(),
        ) {
            e.side_frees.push(SideFree { node: *node, after });
        }
    }
    true
}

/// Joins the noted frees `frees` that qualify (see the module docs) into the frontier
/// of the capturing `origin` stream, just before its capture ends. Best effort: when
/// the driver refuses, `cuStreamEndCapture` reports the unjoined work as it would have
/// anyway.
///
/// # Safety
/// `origin` is the live, capturing origin stream of the capture the nodes of `frees`
/// were captured into, and that capture has not ended.
pub(super) unsafe fn join_side_frees(origin: sys::CUstream, frees: &[SideFree]) {
    if frees.is_empty() {
        return;
    }
    // SAFETY: `origin` is live and capturing (caller).
    let Ok(frontier) = (unsafe { result::stream::get_capture_dependencies(origin) }) else {
        return;
    };
    // SAFETY: the nodes reached are nodes of the capture's graph, live until the
    // capture ends (caller).
    let deps_of = |n: usize| {
        unsafe { result::graph::node_get_dependencies(n as sys::CUgraphNode) }.map(addrs)
    };
    let Ok(joined) = ancestors(&addrs(frontier), deps_of) else {
        return;
    };
    let join = nodes_to_join(frees, &joined, |n| {
        // SAFETY: as above; a refusal counts as "has dependents": not joined then.
        unsafe { result::graph::node_dependent_count(n as sys::CUgraphNode) }
            .map_or(true, |c| c > 0)
    });
    let nodes: Vec<sys::CUgraphNode> = join.into_iter().map(|n| n as sys::CUgraphNode).collect();
    // SAFETY: `origin` is live and capturing; `nodes` are nodes of its capture's graph.
    let _ = unsafe { result::stream::add_capture_dependencies(origin, &nodes) };
}

/// The nodes of `frontier` and every node they depend on, directly or not.
pub(crate) fn ancestors<E>(
    frontier: &[usize],
    mut deps_of: impl FnMut(usize) -> Result<Vec<usize>, E>,
) -> Result<HashSet<usize>, E> {
    let mut seen: HashSet<usize> = frontier.iter().copied().collect();
    let mut todo: Vec<usize> = frontier.to_vec();
    while let Some(n) = todo.pop() {
        for d in deps_of(n)? {
            if seen.insert(d) {
                todo.push(d);
            }
        }
    }
    Ok(seen)
}

/// Which noted frees (in capture order) to add to the origin's frontier, given
/// `joined`, the origin's frontier and its ancestors. A free qualifies when all it
/// came after is joined or qualifies itself; of those, the ones not joined already
/// and with no dependents are added (each once): the others are ancestors of them.
pub(crate) fn nodes_to_join(
    frees: &[SideFree],
    joined: &HashSet<usize>,
    has_dependents: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut ok: HashSet<usize> = HashSet::new();
    for f in frees {
        if f.after.iter().all(|a| joined.contains(a) || ok.contains(a)) {
            ok.insert(f.node);
        }
    }
    let mut out: Vec<usize> = Vec::new();
    for f in frees {
        let n = f.node;
        if ok.contains(&n) && !joined.contains(&n) && !out.contains(&n) && !has_dependents(n) {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn free(node: usize, after: &[usize]) -> SideFree {
        SideFree {
            node,
            after: after.to_vec(),
        }
    }

    fn set(v: &[usize]) -> HashSet<usize> {
        v.iter().copied().collect()
    }

    /// A graph as node -> its dependencies.
    fn deps(edges: &[(usize, &[usize])]) -> impl FnMut(usize) -> Result<Vec<usize>, ()> {
        let m: HashMap<usize, Vec<usize>> = edges.iter().map(|(n, d)| (*n, d.to_vec())).collect();
        move |n| Ok(m.get(&n).cloned().unwrap_or_default())
    }

    #[test]
    fn ancestors_walk_every_path_back_once() {
        // 1 <- 2 <- 4, 1 <- 3 <- 4, 5 unrelated
        let got = ancestors(&[4], deps(&[(4, &[2, 3]), (2, &[1]), (3, &[1]), (5, &[1])]));
        assert_eq!(got, Ok(set(&[1, 2, 3, 4])));
    }

    #[test]
    fn ancestors_report_the_drivers_refusal() {
        let got = ancestors(&[1], |_| Err::<Vec<usize>, _>("refused"));
        assert_eq!(got, Err("refused"));
    }

    #[test]
    fn a_free_after_the_join_is_joined() {
        // fork work 7 is joined (ancestor of the origin's frontier); the free 10 came
        // after it and is a leaf.
        let got = nodes_to_join(&[free(10, &[7])], &set(&[1, 7]), |_| false);
        assert_eq!(got, vec![10]);
    }

    #[test]
    fn a_chain_of_late_frees_joins_its_last_one() {
        // 10 after the joined 7, 11 after 10: joining 11 joins 10 too.
        let frees = [free(10, &[7]), free(11, &[10])];
        let got = nodes_to_join(&frees, &set(&[1, 7]), |n| n == 10);
        assert_eq!(got, vec![11]);
    }

    #[test]
    fn a_free_after_unjoined_work_is_not_joined() {
        // 8 (a kernel after the join, or a fork never joined) is not an ancestor of the
        // origin's frontier: the capture must fail as CUDA says.
        assert!(nodes_to_join(&[free(10, &[8])], &set(&[1, 7]), |_| false).is_empty());
        assert!(nodes_to_join(&[free(10, &[7, 8])], &set(&[1, 7]), |_| false).is_empty());
    }

    #[test]
    fn a_free_already_joined_or_with_dependents_is_left_alone() {
        // Freed before the join event: the origin's wait made it an ancestor.
        assert!(nodes_to_join(&[free(10, &[7])], &set(&[1, 7, 10]), |_| false).is_empty());
        // Later work depends on it: joined through that work, or that work is unjoined.
        assert!(nodes_to_join(&[free(10, &[7])], &set(&[1, 7]), |_| true).is_empty());
    }

    #[test]
    fn each_free_is_joined_once() {
        let frees = [free(10, &[7]), free(10, &[7])];
        assert_eq!(nodes_to_join(&frees, &set(&[7]), |_| false), vec![10]);
    }
}
