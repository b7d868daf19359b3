//! CUDA version numbers: `13000` means 13.0, `12080` means 12.8.

/// A CUDA version as CUDA encodes it: `1000 * major + 10 * minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    /// Major version (13 for CUDA 13.0).
    pub major: u32,
    /// Minor version (0 for CUDA 13.0).
    pub minor: u32,
}

impl CudaVersion {
    /// Decodes CUDA's integer form; `None` for a negative number.
    ///
    /// ```
    /// let v = cuda_sys::CudaVersion::from_int(12080).unwrap();
    /// assert_eq!((v.major, v.minor), (12, 8));
    /// ```
    pub fn from_int(v: i32) -> Option<Self> {
        let v = u32::try_from(v).ok()?;
        Some(CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        })
    }

    /// CUDA's integer form.
    pub fn to_int(self) -> i32 {
        (self.major * 1000 + self.minor * 10) as i32
    }

    /// Parses `"13.0"`, `"12.8"` or `"12"`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().splitn(3, '.');
        let major = it.next()?.parse().ok()?;
        let minor = match it.next() {
            Some(m) => m.parse().ok()?,
            None => 0,
        };
        Some(CudaVersion { major, minor })
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// `13000` as `"13.0"`; a negative number as itself.
pub fn format_version(v: i32) -> String {
    CudaVersion::from_int(v).map_or_else(|| v.to_string(), |c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_versions_decode_to_major_minor() {
        assert_eq!(
            CudaVersion::from_int(13000),
            Some(CudaVersion {
                major: 13,
                minor: 0
            })
        );
        assert_eq!(CudaVersion::from_int(12080).unwrap().to_string(), "12.8");
        assert_eq!(CudaVersion::from_int(11040).unwrap().to_int(), 11040);
        assert_eq!(CudaVersion::from_int(-1), None);
    }

    #[test]
    fn text_versions_parse() {
        assert_eq!(CudaVersion::parse("13.0"), CudaVersion::from_int(13000));
        assert_eq!(CudaVersion::parse(" 12.8 "), CudaVersion::from_int(12080));
        assert_eq!(CudaVersion::parse("12"), CudaVersion::from_int(12000));
        assert_eq!(CudaVersion::parse("twelve"), None);
        assert!(CudaVersion::parse("12.8").unwrap() < CudaVersion::parse("13.0").unwrap());
    }

    #[test]
    fn format_version_handles_bad_numbers() {
        assert_eq!(format_version(13000), "13.0");
        assert_eq!(format_version(-5), "-5");
    }
}
