//! Device attributes by name (the enum itself is generated in `attribute_table.rs`).

use super::attribute_table::ALIASES;
use super::DeviceAttribute;

const PREFIX: &str = "CU_DEVICE_ATTRIBUTE_";

/// Whether two attribute names match once the driver prefix and `_` are dropped and
/// case is ignored.
fn same_name(name: &str, target: &str) -> bool {
    let strip = |s: &'_ str| -> String {
        // `get` rather than indexing: a name with a multi-byte character at the cut is
        // simply not prefixed, never a panic.
        let s = match (s.get(..PREFIX.len()), s.get(PREFIX.len()..)) {
            (Some(head), Some(rest)) if head.eq_ignore_ascii_case(PREFIX) => rest,
            _ => s,
        };
        s.chars()
            .filter(|&c| c != '_')
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    strip(name) == strip(target)
}

impl DeviceAttribute {
    /// The attribute named `name`: its CamelCase [`name`](Self::name)
    /// (`MaxThreadsPerBlock`), the driver's constant
    /// (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`) or the constant without its prefix
    /// (`MAX_THREADS_PER_BLOCK`), in any case; deprecated driver names
    /// (`SHARED_MEMORY_PER_BLOCK`) give the attribute they alias.
    pub fn from_name(name: &str) -> Option<DeviceAttribute> {
        DeviceAttribute::ALL
            .iter()
            .copied()
            .find(|a| same_name(name, a.name()))
            .or_else(|| {
                ALIASES
                    .iter()
                    .find(|(alias, _)| same_name(name, alias))
                    .map(|&(_, a)| a)
            })
    }
}

impl std::fmt::Display for DeviceAttribute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DeviceAttribute {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceAttribute::from_name(s).ok_or_else(|| {
            crate::Error::invalid_argument(
                crate::error::ArgumentKind::NotFound,
                format!("{s:?} is not a device attribute"),
            )
        })
    }
}
