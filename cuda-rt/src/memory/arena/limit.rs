//! Pure helpers around the pool limit: parsing the limit variable's value (CuPy's
//! forms), fractions of device memory, and byte counts in words.

/// Parses a limit as CuPy's `CUPY_GPU_MEMORY_LIMIT` accepts it: a byte count
/// (`"1073741824"`) or a percentage of `total_device_bytes` (`"40%"`, `"12.5%"`).
/// Surrounding whitespace is ignored; `"0"` means no limit. Negative values,
/// percentages over 100, and anything else are refused with a message that quotes
/// the input.
pub fn parse_limit(value: &str, total_device_bytes: u64) -> Result<u64, String> {
    let v = value.trim();
    if let Some(pct) = v.strip_suffix('%') {
        let p: f64 = pct
            .trim()
            .parse()
            .map_err(|_| format!("memory limit {value:?}: {pct:?} is not a number"))?;
        limit_from_fraction(p / 100.0, total_device_bytes)
            .map_err(|e| format!("memory limit {value:?}: {e}"))
    } else {
        v.parse::<u64>().map_err(|_| {
            if v.starts_with('-') {
                format!("memory limit {value:?}: a limit cannot be negative")
            } else {
                format!(
                    "memory limit {value:?}: expected a byte count like \"1073741824\" \
                     or a percentage like \"40%\""
                )
            }
        })
    }
}

/// `fraction` (0.0 ..= 1.0) of `total_device_bytes`, in bytes (CuPy's
/// `set_limit(fraction=f)`); negative, over 1 or not a number is an error.
pub fn limit_from_fraction(fraction: f64, total_device_bytes: u64) -> Result<u64, String> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(format!(
            "the fraction must be between 0 and 1 (0% and 100%), got {fraction}"
        ));
    }
    Ok((total_device_bytes as f64 * fraction) as u64)
}
