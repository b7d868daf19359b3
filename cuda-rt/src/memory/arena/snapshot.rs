//! A picture of a pool at one moment: every segment (backend allocation) and every
//! block in it, as a value and as JSON close to PyTorch's
//! `torch.cuda.memory._snapshot()`.

use std::fmt::Write as _;

use super::backend::Backend;
use super::pool::Pool;

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSnapshot {
    /// Its address.
    pub address: u64,
    /// Its size in bytes (the rounded size the pool handed out: the pool does not keep
    /// what was asked for).
    pub size: u64,
    /// Handed out (`true`) or cached free.
    pub in_use: bool,
    /// Freed, but waiting for other streams' work before it is handed out again
    /// ([`MemoryPointer::record_stream`](crate::memory::MemoryPointer::record_stream));
    /// `in_use` is then `true` (the arena still holds it) and it is not counted as
    /// allocated, as the pool's statistics do not count it as used.
    pub pending_free: bool,
}

/// One segment: a backend allocation of one stream's arena, cut into blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// The stream key of the arena it belongs to (the stream's handle as an integer).
    pub stream: u64,
    /// Its address.
    pub address: u64,
    /// Its size in bytes: the sum of its blocks (for an expandable segment, what is
    /// mapped now).
    pub total_size: u64,
    /// An expandable segment (grown in place, see
    /// [`Pool::set_expandable_segments`](super::Pool::set_expandable_segments)).
    pub expandable: bool,
    /// Its blocks in address order.
    pub blocks: Vec<BlockSnapshot>,
}

impl SegmentSnapshot {
    /// Bytes of its blocks that are handed out.
    pub fn allocated_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.in_use && !b.pending_free)
            .map(|b| b.size)
            .sum()
    }
}

/// Every segment of a pool at one moment (see [`Pool::snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolSnapshot {
    /// The device of the pool (`None`: host memory or a test backend).
    pub device: Option<i32>,
    /// Segments sorted by stream key, then address.
    pub segments: Vec<SegmentSnapshot>,
}

impl PoolSnapshot {
    /// Bytes reserved from the backend: the sum of the segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Bytes handed out.
    pub fn allocated_bytes(&self) -> u64 {
        self.segments
            .iter()
            .map(SegmentSnapshot::allocated_size)
            .sum()
    }

    /// The snapshot as JSON in the shape of PyTorch's `torch.cuda.memory._snapshot()`
    /// where the two meet: `{"segments": [{"device", "address", "total_size",
    /// "allocated_size", "active_size", "requested_size", "stream", "segment_type",
    /// "segment_pool_id", "is_expandable", "frames", "blocks": [{"address", "size",
    /// "requested_size", "state", "frames"}]}], "device_traces": [[]]}`. A block's
    /// `state` is `"active_allocated"`, `"active_pending_free"` (freed, waiting for
    /// other streams) or `"inactive"`; requested sizes are the block sizes (not kept);
    /// no frames (call stacks) are recorded.
    pub fn to_json(&self) -> String {
        let device = self.device.unwrap_or(-1);
        let mut out = String::from("{\"segments\": [");
        for (i, s) in self.segments.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let allocated = s.allocated_size();
            let kind = if s.total_size <= 1 << 20 {
                "small"
            } else {
                "large"
            };
            let _ = write!(
                out,
                "{{\"device\": {device}, \"address\": {}, \"total_size\": {}, \
                 \"allocated_size\": {allocated}, \"active_size\": {allocated}, \
                 \"requested_size\": {allocated}, \"stream\": {}, \"segment_type\": \"{kind}\", \
                 \"segment_pool_id\": [0, 0], \"is_expandable\": {}, \"frames\": [], \
                 \"blocks\": [",
                s.address, s.total_size, s.stream, s.expandable
            );
            for (j, b) in s.blocks.iter().enumerate() {
                if j > 0 {
                    out.push_str(", ");
                }
                let state = match (b.in_use, b.pending_free) {
                    (true, false) => "active_allocated",
                    (true, true) => "active_pending_free",
                    (false, _) => "inactive",
                };
                let requested = if b.in_use { b.size } else { 0 };
                let _ = write!(
                    out,
                    "{{\"address\": {}, \"size\": {}, \"requested_size\": {requested}, \
                     \"state\": \"{state}\", \"frames\": []}}",
                    b.address, b.size
                );
            }
            out.push_str("]}");
        }
        out.push_str("], \"device_traces\": [[]]}");
        out
    }
}

impl<B: Backend> Pool<B> {
    /// Every segment and block of every stream's arena now (blocks parked in threads'
    /// caches are settled back first, so they show as free). Takes each arena's lock
    /// in turn: for inspection, not for hot paths.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.settle_all();
        let mut segments = Vec::new();
        for arena in self.arenas.iter() {
            let key = arena.key;
            let pending = arena.awaiting_addresses();
            for (address, expandable, chunks) in arena.lock_unchanged().segments() {
                let blocks: Vec<BlockSnapshot> = chunks
                    .into_iter()
                    .map(|(address, size, in_use)| BlockSnapshot {
                        address,
                        size,
                        in_use,
                        pending_free: in_use && pending.contains(&address),
                    })
                    .collect();
                segments.push(SegmentSnapshot {
                    stream: key,
                    address,
                    total_size: blocks.iter().map(|b| b.size).sum(),
                    expandable,
                    blocks,
                });
            }
        }
        segments.sort_by_key(|s| (s.stream, s.address));
        PoolSnapshot {
            device: None,
            segments,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::FakeBackend;
    use super::*;

    #[test]
    fn a_snapshot_shows_every_segment_and_block_and_adds_up() {
        let pool = Pool::new(FakeBackend::checked());
        let a = pool.malloc(1000, 0).unwrap();
        let b = pool.malloc(3 << 20, 0).unwrap();
        let c = pool.malloc(5000, 7).unwrap();
        pool.free(a).unwrap();
        let snap = pool.snapshot();
        let stats = pool.stats();
        assert_eq!(snap.reserved_bytes(), stats.total_bytes);
        assert_eq!(snap.allocated_bytes(), stats.used_bytes);
        assert!(snap.segments.iter().any(|s| s.stream == 7));
        for s in &snap.segments {
            assert_eq!(s.address, s.blocks[0].address);
            let mut next = s.address;
            for blk in &s.blocks {
                assert_eq!(blk.address, next, "blocks are contiguous in address order");
                next += blk.size;
            }
        }
        let used: Vec<u64> = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.in_use)
            .map(|b| b.address)
            .collect();
        assert!(used.contains(&b.addr()) && used.contains(&c.addr()));
        pool.free(b).unwrap();
        pool.free(c).unwrap();
        assert_eq!(pool.snapshot().allocated_bytes(), 0);
    }

    #[test]
    fn the_json_has_pytorchs_shape() {
        let pool = Pool::new(FakeBackend::checked());
        let a = pool.malloc(4096, 3).unwrap();
        let mut snap = pool.snapshot();
        snap.device = Some(0);
        let j = snap.to_json();
        assert!(
            j.starts_with("{\"segments\": [{\"device\": 0, \"address\": "),
            "{j}"
        );
        assert!(j.contains("\"state\": \"active_allocated\""), "{j}");
        assert!(j.contains("\"stream\": 3"), "{j}");
        assert!(j.ends_with("], \"device_traces\": [[]]}"), "{j}");
        let opens = j.matches(['{', '[']).count();
        let closes = j.matches(['}', ']']).count();
        assert_eq!(opens, closes, "{j}");
        assert!(j.contains("\"is_expandable\": false"), "{j}");
        pool.free(a).unwrap();
        assert_eq!(
            Pool::new(FakeBackend::checked()).snapshot().to_json(),
            "{\"segments\": [], \"device_traces\": [[]]}"
        );
    }

    #[test]
    fn expandable_segments_say_so_and_plain_ones_do_not() {
        use super::super::backend::SegmentSpec;
        let backend = std::sync::Arc::new(FakeBackend::checked().with_segments(SegmentSpec {
            granularity: 2 << 20,
            reserve: 1 << 30,
        }));
        let pool = Pool::new(backend);
        let plain = pool.malloc(3 << 20, 0).unwrap();
        pool.set_expandable_segments(true);
        let grown = pool.malloc(3 << 20, 0).unwrap();
        let snap = pool.snapshot();
        let kind = |addr: u64| {
            snap.segments
                .iter()
                .find(|s| s.address <= addr && addr < s.address + s.total_size)
                .map(|s| s.expandable)
        };
        assert_eq!(kind(plain.addr()), Some(false), "{snap:?}");
        assert_eq!(kind(grown.addr()), Some(true), "{snap:?}");
        let j = snap.to_json();
        assert!(j.contains("\"is_expandable\": true"), "{j}");
        assert!(j.contains("\"is_expandable\": false"), "{j}");
        pool.free(plain).unwrap();
        pool.free(grown).unwrap();
    }
}
