//! Cooperative launches: the whole grid resident at once, so that blocks may wait for
//! each other (`cooperative_groups::this_grid().sync()`); refused when the grid does
//! not fit, or shrunk to fit on request (a 1-D grid, as CuPy does).

use super::{Dim3, KernelArg, Kind, LaunchConfig};
use crate::error::{ArgumentKind, Error, Result};
use crate::module::Function;
use crate::stream::AsStream;

impl Function {
    /// A cooperative launch (`cuLaunchCooperativeKernel`): the whole grid must fit on
    /// the device at once, and may synchronise with `cooperative_groups::this_grid()`.
    /// Arguments are checked as for [`Function::launch`]. A grid that does not fit is
    /// refused (an [`Error::InvalidArgument`] with the limit) rather than shrunk:
    /// [`launch_cooperative_clamped`](Function::launch_cooperative_clamped) shrinks a
    /// 1-D grid, as CuPy does, for kernels written with a grid-stride loop.
    ///
    /// # Safety
    /// As for [`Function::launch`]: the arguments match the kernel's parameters in
    /// number, order and type; every pointer the kernel follows is valid for all its
    /// accesses, on the function's device, until the kernel completes on `stream`; no
    /// host access or unordered device work races with the kernel on that memory; in a
    /// capture begun outside cuda-rt, the module stays loaded until the graph's last
    /// launch completes.
    #[inline]
    pub unsafe fn launch_cooperative(
        &self,
        stream: &impl AsStream,
        config: &LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        self.check_co_resident(config)?;
        // SAFETY: the caller guarantees the arguments (see `# Safety`).
        unsafe { self.launch_typed(Kind::Cooperative, stream, config, args) }
    }

    /// A cooperative launch that shrinks a 1-D grid too large to be resident at once to
    /// the most blocks the device holds (the occupancy calculator's blocks per
    /// multiprocessor times the multiprocessor count, [`max_cooperative_grid`]), as
    /// CuPy does for cooperative kernels (with a warning there; here the return value
    /// says so, and nothing is printed). Only for kernels that cover their work with a
    /// grid-stride loop (`for (i = blockIdx.x; i < n; i += gridDim.x)`): a kernel that
    /// maps one block to one piece of work would skip the pieces past the shrunk grid.
    ///
    /// Returns the grid launched and the one asked for; check
    /// [`CooperativeGrid::shrunk`]. A grid that fits is launched as it is, whatever its
    /// shape. Refused, as by [`launch_cooperative`](Function::launch_cooperative):
    /// a 2-D or 3-D grid that does not fit (which dimension to shrink is the kernel's
    /// business), and a block shape of which not even one block fits.
    ///
    /// [`max_cooperative_grid`]: Function::max_cooperative_grid
    ///
    /// # Safety
    /// As for [`Function::launch`], and: the kernel is correct for any grid of at least
    /// one block (a grid-stride loop), since the grid it gets may be smaller than
    /// `config`'s.
    pub unsafe fn launch_cooperative_clamped(
        &self,
        stream: &impl AsStream,
        config: &LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<CooperativeGrid> {
        let max = self.max_cooperative_grid(config)?;
        let grid = clamp_cooperative_grid(config, max)?;
        let launched = LaunchConfig { grid, ..*config };
        // SAFETY: the caller guarantees the arguments, and that the kernel is correct
        // for the (possibly smaller) grid (see `# Safety`); the grid fits (clamped).
        unsafe { self.launch_typed(Kind::Cooperative, stream, &launched, args) }?;
        Ok(CooperativeGrid {
            launched: grid,
            requested: config.grid,
        })
    }

    /// The most blocks of `config`'s shape that can be resident on the device at once
    /// (the occupancy calculator's blocks per multiprocessor times the multiprocessor
    /// count): the largest grid a cooperative launch takes.
    pub fn max_cooperative_grid(&self, config: &LaunchConfig) -> Result<u64> {
        let per_sm = self.max_active_blocks_per_multiprocessor(
            u32::try_from(config.block.count()).unwrap_or(u32::MAX),
            config.shared_mem_bytes as usize,
        )?;
        let sms = crate::Device::new(self.device_id())?.multiprocessor_count()?;
        Ok(per_sm.max(0) as u64 * sms.max(0) as u64)
    }

    /// Refuses, before the driver, a cooperative grid that cannot be co-resident.
    pub(super) fn check_co_resident(&self, config: &LaunchConfig) -> Result<()> {
        let max = self.max_cooperative_grid(config)?;
        if config.grid.count() > max {
            return Err(too_large_cooperative_grid(
                config,
                max,
                "use a grid of at most {max} blocks, with a grid-stride loop (or \
                 Function::launch_cooperative_clamped, which shrinks a 1-D grid to that)",
            ));
        }
        Ok(())
    }
}

/// What [`Function::launch_cooperative_clamped`] launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the grid may have been shrunk: check `shrunk()`"]
pub struct CooperativeGrid {
    /// The grid the kernel ran with.
    pub launched: Dim3,
    /// The grid asked for.
    pub requested: Dim3,
}

impl CooperativeGrid {
    /// Whether the grid was shrunk to fit the device (then `launched.x <
    /// requested.x`).
    pub fn shrunk(&self) -> bool {
        self.launched != self.requested
    }
}

/// The grid a clamped cooperative launch of `config` runs with, when at most `max`
/// blocks of its shape are resident at once: `config.grid` if it fits, else a 1-D grid
/// of `max` blocks. Refuses a 2-D or 3-D grid that does not fit, and `max == 0`
/// (not one block fits). Pure.
pub(crate) fn clamp_cooperative_grid(config: &LaunchConfig, max: u64) -> Result<Dim3> {
    let grid = config.grid;
    if grid.count() <= max {
        return Ok(grid);
    }
    if max == 0 {
        return Err(too_large_cooperative_grid(
            config,
            max,
            "not one block of this shape fits on a multiprocessor: use smaller blocks or \
             less shared memory",
        ));
    }
    if grid.y != 1 || grid.z != 1 {
        return Err(too_large_cooperative_grid(
            config,
            max,
            "only a 1-D grid is shrunk to fit: use a grid of at most {max} blocks",
        ));
    }
    // max < grid.x here, so it fits in a u32.
    let x = u32::try_from(max).unwrap_or(grid.x);
    Ok(Dim3::new(x, 1, 1))
}

/// The error for a cooperative grid of `config` larger than `max` resident blocks;
/// `advice` (with `{max}` replaced) says what to do.
#[cold]
fn too_large_cooperative_grid(config: &LaunchConfig, max: u64, advice: &str) -> Error {
    let g = config.grid;
    Error::invalid_argument(
        ArgumentKind::InvalidValue,
        format!(
            "a cooperative launch needs its whole grid resident at once: {} blocks \
             ({}x{}x{}) of {} threads ({} bytes of dynamic shared memory) were asked for, \
             and the device holds at most {max} of them (the occupancy calculator's \
             blocks per multiprocessor times the multiprocessor count); {}",
            g.count(),
            g.x,
            g.y,
            g.z,
            config.block.count(),
            config.shared_mem_bytes,
            advice.replace("{max}", &max.to_string())
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cooperative_1d_grid_that_does_not_fit_is_shrunk_to_the_resident_limit() {
        let cfg = LaunchConfig::new(1000, 128);
        assert_eq!(
            clamp_cooperative_grid(&cfg, 264).unwrap(),
            Dim3::new(264, 1, 1)
        );
        assert_eq!(
            clamp_cooperative_grid(&cfg, 1000).unwrap(),
            Dim3::new(1000, 1, 1)
        );
    }

    #[test]
    fn a_cooperative_grid_that_fits_keeps_its_shape() {
        let cfg = LaunchConfig::new((4, 2, 2), 64);
        assert_eq!(
            clamp_cooperative_grid(&cfg, 16).unwrap(),
            Dim3::new(4, 2, 2)
        );
    }

    #[test]
    fn a_cooperative_2d_grid_or_a_shape_that_never_fits_is_refused() {
        let e = clamp_cooperative_grid(&LaunchConfig::new((100, 2), 64), 132).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                kind: ArgumentKind::InvalidValue,
                ..
            }
        ));
        let msg = e.to_string();
        assert!(msg.contains("200 blocks (100x2x1)"), "{msg}");
        assert!(msg.contains("only a 1-D grid is shrunk"), "{msg}");
        assert!(msg.contains("at most 132 blocks"), "{msg}");
        let e = clamp_cooperative_grid(&LaunchConfig::new(10, 1024), 0).unwrap_err();
        assert!(e.to_string().contains("not one block"), "{e}");
    }
}
