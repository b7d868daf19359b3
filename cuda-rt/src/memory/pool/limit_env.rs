//! The default limit of a device's pool, from the environment ([`LIMIT_ENV`]).

use crate::error::{ArgumentKind, Error, Result};
use crate::memory::arena::parse_limit;

/// The environment variable with the default limit of each device's pool, read when
/// the pool of a device is created: a byte count (`"1073741824"`) or a percentage of
/// the device's total memory (`"40%"`); `"0"` or unset: no limit (CuPy's
/// `CUPY_GPU_MEMORY_LIMIT`).
pub const LIMIT_ENV: &str = "CUDA_RT_GPU_MEMORY_LIMIT";

/// The limit of a new device pool from the value of [`LIMIT_ENV`] (`None`: unset).
/// `total` gives the device's memory, asked only for a percentage.
pub(crate) fn limit_from_env(
    value: Option<&str>,
    total: impl FnOnce() -> Result<u64>,
) -> Result<u64> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(0);
    };
    let total = if v.trim_end().ends_with('%') {
        total()?
    } else {
        0
    };
    parse_limit(v, total).map_err(|e| {
        Error::invalid_argument(ArgumentKind::InvalidValue, format!("{LIMIT_ENV}: {e}"))
    })
}

pub(crate) fn device_total_memory(device: i32) -> Result<u64> {
    crate::device::context::init()?;
    let dev = cuda_sys::result::device::get(device)?;
    Ok(cuda_sys::result::device::total_mem(dev)? as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_env_accepts_bytes_and_percent_of_device_memory() {
        let total = || Ok(1u64 << 30);
        assert_eq!(limit_from_env(None, total).unwrap(), 0);
        assert_eq!(limit_from_env(Some(""), total).unwrap(), 0);
        assert_eq!(limit_from_env(Some("1073741824"), total).unwrap(), 1 << 30);
        assert_eq!(limit_from_env(Some("0"), total).unwrap(), 0);
        assert_eq!(
            limit_from_env(Some("40%"), total).unwrap(),
            (1u64 << 30) * 2 / 5
        );
        assert_eq!(limit_from_env(Some(" 50% "), total).unwrap(), 1 << 29);
        // A byte count needs no device query.
        let no_device = || -> Result<u64> { panic!("device memory asked for a byte count") };
        assert_eq!(limit_from_env(Some("4096"), no_device).unwrap(), 4096);
        for bad in ["-1", "150%", "lots", "1.5"] {
            let e = limit_from_env(Some(bad), total).unwrap_err();
            assert!(matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::InvalidValue,
                    ..
                }
            ));
            assert!(e.to_string().contains(LIMIT_ENV), "{e}");
        }
        // A failing device query for a percentage is the caller's error.
        let fail = || Err(Error::NotAvailable(crate::error::Unavailable::NoDevice));
        assert!(matches!(
            limit_from_env(Some("10%"), fail),
            Err(Error::NotAvailable(crate::error::Unavailable::NoDevice))
        ));
    }
}
