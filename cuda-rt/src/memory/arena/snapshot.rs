//! A picture of a pool at one moment: every segment (backend allocation) and every
//! block in it, as a value and as JSON close to PyTorch's
//! `torch.cuda.memory._snapshot()` (with the `serde` feature, on by default), which
//! reads back too.

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
    /// Bytes of its blocks that are handed out (saturating: a snapshot read back from
    /// a damaged file may hold any sizes).
    pub fn allocated_size(&self) -> u64 {
        saturating_sum(
            self.blocks
                .iter()
                .filter(|b| b.in_use && !b.pending_free)
                .map(|b| b.size),
        )
    }
}

/// The sum of `sizes`, saturating at `u64::MAX`.
fn saturating_sum(sizes: impl Iterator<Item = u64>) -> u64 {
    sizes.fold(0, u64::saturating_add)
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
        saturating_sum(self.segments.iter().map(|s| s.total_size))
    }

    /// Bytes handed out.
    pub fn allocated_bytes(&self) -> u64 {
        saturating_sum(self.segments.iter().map(SegmentSnapshot::allocated_size))
    }
}

// JSON: PyTorch's snapshot shape, through serde (the `serde` feature, on by default).
#[cfg(feature = "serde")]
mod json {
    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    use super::{BlockSnapshot, PoolSnapshot, SegmentSnapshot};
    use crate::memory::snapshot_json::{
        self as wire, ACTIVE_ALLOCATED, ACTIVE_AWAITING_FREE, ACTIVE_PENDING_FREE, INACTIVE,
        NO_DEVICE,
    };

    /// Segments of at most this many bytes are PyTorch's small pool's.
    const SMALL_SEGMENT: u64 = 1 << 20;

    impl PoolSnapshot {
        /// The snapshot as JSON in the shape of PyTorch's `torch.cuda.memory._snapshot()`
        /// where the two meet (what its `_memory_viz` tools and cuda-rt's
        /// [`history`](crate::memory::history) viewer read): `{"segments": [{"device",
        /// "address", "total_size", "allocated_size", "active_size", "requested_size",
        /// "stream", "segment_type", "segment_pool_id", "is_expandable", "frames",
        /// "blocks": [{"address", "size", "requested_size", "state", "frames"}]}],
        /// "device_traces": [[]]}`, spaced as Python's `json.dumps`. A block's `state`
        /// is `"active_allocated"`, `"active_awaiting_free"` (freed, waiting for other
        /// streams) or `"inactive"`; requested sizes are the block sizes (not kept); no
        /// frames (call stacks) are recorded; `device` is -1 for a pool of no device.
        /// The same as `serde_json::to_string(&snapshot)` but for the spacing; read it
        /// back with [`PoolSnapshot::from_json`].
        pub fn to_json(&self) -> String {
            wire::to_string(self)
        }

        /// A snapshot read back from JSON: this crate's ([`PoolSnapshot::to_json`]) or
        /// PyTorch's (`torch.cuda.memory._snapshot()` written with `json.dump`; its
        /// traces are not part of a pool snapshot and are skipped). The device is the
        /// segments' (`None` when there are none, or for -1); the segments are sorted
        /// by stream, then address. An error, saying where, for text that is not such
        /// a snapshot, for an unknown block state, or for segments of several devices
        /// (a pool snapshot is one device's: keep one device's segments).
        pub fn from_json(json: &str) -> crate::Result<PoolSnapshot> {
            serde_json::from_str(json).map_err(|e| wire::read_error("a memory snapshot", e))
        }

        fn to_wire(&self) -> wire::Snapshot {
            let device = self.device.unwrap_or(NO_DEVICE);
            let segments = self
                .segments
                .iter()
                .map(|s| {
                    let allocated = s.allocated_size();
                    let active =
                        super::saturating_sum(s.blocks.iter().filter(|b| b.in_use).map(|b| b.size));
                    wire::Segment {
                        device,
                        address: s.address,
                        total_size: s.total_size,
                        allocated_size: allocated,
                        active_size: active,
                        requested_size: allocated,
                        stream: s.stream,
                        segment_type: if s.total_size <= SMALL_SEGMENT {
                            "small"
                        } else {
                            "large"
                        }
                        .to_owned(),
                        segment_pool_id: (0, 0),
                        is_expandable: s.expandable,
                        frames: Vec::new(),
                        blocks: s.blocks.iter().map(block_to_wire).collect(),
                    }
                })
                .collect();
            wire::Snapshot {
                segments,
                device_traces: vec![Vec::new()],
            }
        }

        fn from_wire(w: wire::Snapshot) -> Result<PoolSnapshot, String> {
            let mut devices: Vec<i32> = w.segments.iter().map(|s| s.device).collect();
            devices.sort_unstable();
            devices.dedup();
            if devices.len() > 1 {
                return Err(format!(
                    "segments of devices {devices:?}: a pool snapshot is one device's"
                ));
            }
            let mut segments = w
                .segments
                .into_iter()
                .map(segment_from_wire)
                .collect::<Result<Vec<_>, String>>()?;
            segments.sort_by_key(|s| (s.stream, s.address));
            Ok(PoolSnapshot {
                device: devices.first().copied().filter(|&d| d != NO_DEVICE),
                segments,
            })
        }
    }

    fn block_to_wire(b: &BlockSnapshot) -> wire::Block {
        let state = match (b.in_use, b.pending_free) {
            (true, false) => ACTIVE_ALLOCATED,
            (true, true) => ACTIVE_AWAITING_FREE,
            (false, _) => INACTIVE,
        };
        wire::Block {
            address: Some(b.address),
            size: b.size,
            requested_size: if b.in_use { b.size } else { 0 },
            state: state.to_owned(),
            frames: Vec::new(),
        }
    }

    fn segment_from_wire(s: wire::Segment) -> Result<SegmentSnapshot, String> {
        // Blocks without an address follow each other from the segment's start.
        let mut next = s.address;
        let blocks = s
            .blocks
            .into_iter()
            .map(|b| {
                let (in_use, pending_free) = match b.state.as_str() {
                    ACTIVE_ALLOCATED => (true, false),
                    ACTIVE_AWAITING_FREE | ACTIVE_PENDING_FREE => (true, true),
                    INACTIVE => (false, false),
                    other => {
                        return Err(format!(
                            "block state {other:?} is none of {ACTIVE_ALLOCATED:?}, \
                             {ACTIVE_AWAITING_FREE:?}, {INACTIVE:?}"
                        ))
                    }
                };
                let address = b.address.unwrap_or(next);
                next = address.saturating_add(b.size);
                Ok(BlockSnapshot {
                    address,
                    size: b.size,
                    in_use,
                    pending_free,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(SegmentSnapshot {
            stream: s.stream,
            address: s.address,
            total_size: s.total_size,
            expandable: s.is_expandable,
            blocks,
        })
    }

    /// PyTorch's snapshot shape (see [`PoolSnapshot::to_json`]).
    impl Serialize for PoolSnapshot {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.to_wire().serialize(s)
        }
    }

    /// From PyTorch's snapshot shape, this crate's or PyTorch's own (see
    /// [`PoolSnapshot::from_json`]).
    impl<'de> Deserialize<'de> for PoolSnapshot {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PoolSnapshot, D::Error> {
            PoolSnapshot::from_wire(wire::Snapshot::deserialize(d)?).map_err(de::Error::custom)
        }
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
    fn sums_of_sizes_past_u64_saturate() {
        let block = |size| BlockSnapshot {
            address: 0,
            size,
            in_use: true,
            pending_free: false,
        };
        let seg = SegmentSnapshot {
            stream: 0,
            address: 0,
            total_size: u64::MAX,
            expandable: false,
            blocks: vec![block(u64::MAX), block(u64::MAX)],
        };
        let snap = PoolSnapshot {
            device: Some(0),
            segments: vec![seg.clone(), seg],
        };
        assert_eq!(snap.reserved_bytes(), u64::MAX);
        assert_eq!(snap.allocated_bytes(), u64::MAX);
        #[cfg(feature = "serde")]
        assert!(!snap.to_json().is_empty());
    }

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

    #[cfg(feature = "serde")]
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
        let parsed: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(parsed["segments"][0]["blocks"][0]["size"], 4096);
        assert!(j.contains("\"is_expandable\": false"), "{j}");
        pool.free(a).unwrap();
        assert_eq!(
            Pool::new(FakeBackend::checked()).snapshot().to_json(),
            "{\"segments\": [], \"device_traces\": [[]]}"
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_snapshot_reads_back_from_its_json_exactly() {
        let pool = Pool::new(FakeBackend::checked());
        let a = pool.malloc(1000, 0).unwrap();
        let b = pool.malloc(3 << 20, 0).unwrap();
        let c = pool.malloc(5000, 7).unwrap();
        pool.free(a).unwrap();
        let mut snap = pool.snapshot();
        snap.device = Some(2);
        // A block awaiting other streams, as `record_stream` leaves one.
        snap.segments[0].blocks[0].in_use = true;
        snap.segments[0].blocks[0].pending_free = true;
        let j = snap.to_json();
        assert!(j.contains("\"state\": \"active_awaiting_free\""), "{j}");
        assert_eq!(PoolSnapshot::from_json(&j).unwrap(), snap);
        // serde's own entry points give the same value and shape.
        let compact = serde_json::to_string(&snap).unwrap();
        assert_eq!(
            serde_json::from_str::<PoolSnapshot>(&compact).unwrap(),
            snap
        );
        let spaced: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&compact).unwrap(),
            spaced
        );
        pool.free(b).unwrap();
        pool.free(c).unwrap();
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_pytorch_snapshot_reads_as_a_pool_snapshot() {
        // PyTorch's shape with what cuda-rt does not write: blocks without address (an
        // older PyTorch), frames with names, pool ids, an `oom` trace entry.
        let j = r#"{"segments": [{"device": 1, "address": 4096, "total_size": 2097152,
            "allocated_size": 1024, "active_size": 1024, "requested_size": 1000,
            "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
            "frames": [], "blocks": [
              {"size": 1024, "requested_size": 1000, "state": "active_allocated",
               "frames": [{"filename": "model.py", "line": 12, "name": "forward"}]},
              {"size": 2096128, "requested_size": 0, "state": "inactive", "frames": []}]}],
          "device_traces": [[], [{"action": "oom", "size": 1, "device_free": 0,
            "frames": [], "stream": 0}]]}"#;
        let snap = PoolSnapshot::from_json(j).unwrap();
        assert_eq!(snap.device, Some(1));
        let seg = &snap.segments[0];
        assert_eq!(
            (seg.address, seg.total_size, seg.expandable),
            (4096, 2 << 20, false)
        );
        assert_eq!(
            seg.blocks,
            [
                BlockSnapshot {
                    address: 4096,
                    size: 1024,
                    in_use: true,
                    pending_free: false
                },
                BlockSnapshot {
                    address: 5120,
                    size: 2096128,
                    in_use: false,
                    pending_free: false
                },
            ]
        );
        assert_eq!(snap.allocated_bytes(), 1024);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn unreadable_snapshots_say_why() {
        let err = |j: &str| PoolSnapshot::from_json(j).unwrap_err().to_string();
        let e = err(
            r#"{"segments": [{"address": 0, "total_size": 512, "blocks": [
            {"address": 0, "size": 512, "state": "lost"}]}]}"#,
        );
        assert!(
            e.contains("not a memory snapshot") && e.contains("\"lost\""),
            "{e}"
        );
        let e = err(r#"{"segments": [
            {"device": 0, "address": 0, "total_size": 0, "blocks": []},
            {"device": 1, "address": 0, "total_size": 0, "blocks": []}]}"#);
        assert!(e.contains("devices [0, 1]"), "{e}");
        let e = err("{\"segments\": [}");
        assert!(e.contains("line 1"), "{e}");
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
        #[cfg(feature = "serde")]
        {
            let j = snap.to_json();
            assert!(j.contains("\"is_expandable\": true"), "{j}");
            assert!(j.contains("\"is_expandable\": false"), "{j}");
            assert_eq!(PoolSnapshot::from_json(&j).unwrap().segments, snap.segments);
        }
        pool.free(plain).unwrap();
        pool.free(grown).unwrap();
    }

    /// A hole splits an expandable segment's picture into its mapped runs, as
    /// PyTorch's snapshot does: each lists only mapped blocks and they add up to the
    /// reserved bytes.
    #[test]
    fn a_segment_with_a_hole_shows_as_its_mapped_runs() {
        use super::super::backend::SegmentSpec;
        const MIB: usize = 1 << 20;
        let backend = std::sync::Arc::new(FakeBackend::checked().with_segments(SegmentSpec {
            granularity: 2 << 20,
            reserve: 1 << 30,
        }));
        let pool = Pool::new(backend);
        pool.set_expandable_segments(true);
        let x = pool.malloc(MIB, 0).unwrap();
        let m = pool.malloc(6 * MIB, 0).unwrap();
        let y = pool.malloc(MIB, 0).unwrap();
        pool.free(m).unwrap();
        // The growth unmaps 2..6 MiB of the free 1..7 MiB.
        let z = pool.malloc(10 * MIB, 0).unwrap();
        let base = x.addr();
        let snap = pool.snapshot();
        let runs: Vec<(u64, u64, bool)> = snap
            .segments
            .iter()
            .map(|s| (s.address - base, s.total_size, s.expandable))
            .collect();
        let mib = MIB as u64;
        assert_eq!(runs, [(0, 2 * mib, true), (6 * mib, 12 * mib, true)]);
        assert_eq!(snap.reserved_bytes(), pool.stats().total_bytes);
        assert_eq!(snap.allocated_bytes(), pool.stats().used_bytes);
        for s in &snap.segments {
            let mut next = s.address;
            for blk in &s.blocks {
                assert_eq!(blk.address, next, "blocks are contiguous in a run");
                next += blk.size;
            }
        }
        #[cfg(feature = "serde")]
        assert_eq!(PoolSnapshot::from_json(&snap.to_json()).unwrap(), snap);
        for b in [x, y, z] {
            pool.free(b).unwrap();
        }
    }
}
