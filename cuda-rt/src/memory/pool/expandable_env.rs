//! Whether new device pools use expandable segments, from the environment
//! ([`EXPANDABLE_ENV`], else PyTorch's spelling in [`ALLOC_CONF_ENV`]).

use crate::error::{ArgumentKind, Error, Result};

/// The environment variable that turns expandable segments on for every device pool
/// created afterwards: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (any case);
/// unset or empty: see [`ALLOC_CONF_ENV`]. See
/// [`MemoryPool::set_expandable_segments`](super::MemoryPool::set_expandable_segments).
pub const EXPANDABLE_ENV: &str = "CUDA_RT_EXPANDABLE_SEGMENTS";

/// The allocator configuration in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` spelling:
/// comma-separated `key:value` pairs, of which cuda-rt reads `expandable_segments`
/// (`expandable_segments:True`) and ignores the others. [`EXPANDABLE_ENV`], when
/// set, wins.
pub const ALLOC_CONF_ENV: &str = "CUDA_RT_ALLOC_CONF";

fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!("{name}: {v:?} is not a boolean (use 1/true or 0/false)"),
        )),
    }
}

/// Whether expandable segments are on, from the values of [`EXPANDABLE_ENV`] (`flag`)
/// and [`ALLOC_CONF_ENV`] (`conf`); `None` means unset. Off when neither says.
pub(crate) fn expandable_from_env(flag: Option<&str>, conf: Option<&str>) -> Result<bool> {
    if let Some(v) = flag.filter(|v| !v.trim().is_empty()) {
        return parse_bool(EXPANDABLE_ENV, v);
    }
    let mut on = false;
    for pair in conf.unwrap_or("").split(',') {
        if let Some((k, v)) = pair.split_once(':') {
            if k.trim() == "expandable_segments" {
                on = parse_bool(ALLOC_CONF_ENV, v)?;
            }
        }
    }
    Ok(on)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_and_pytorchs_spelling_turn_expandable_segments_on() {
        assert!(!expandable_from_env(None, None).unwrap());
        assert!(expandable_from_env(Some("1"), None).unwrap());
        assert!(expandable_from_env(Some(" TRUE "), None).unwrap());
        assert!(!expandable_from_env(Some("0"), Some("expandable_segments:True")).unwrap());
        assert!(expandable_from_env(None, Some("expandable_segments:True")).unwrap());
        assert!(expandable_from_env(
            Some(""),
            Some("max_split_size_mb:128, expandable_segments:True")
        )
        .unwrap());
        assert!(!expandable_from_env(None, Some("expandable_segments:False")).unwrap());
        assert!(!expandable_from_env(None, Some("garbage_collection_threshold:0.6")).unwrap());
    }

    #[test]
    fn a_value_that_is_not_a_boolean_is_an_error_naming_the_variable() {
        let e = expandable_from_env(Some("maybe"), None).unwrap_err();
        assert!(e.to_string().contains(EXPANDABLE_ENV), "{e}");
        let e = expandable_from_env(None, Some("expandable_segments:sure")).unwrap_err();
        assert!(e.to_string().contains(ALLOC_CONF_ENV), "{e}");
    }
}
