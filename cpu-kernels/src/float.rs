//! CPU feature detection shared by the kernels.

/// FMA present (scalar `mul_add` in `#[target_feature(enable = "fma")]` code becomes one
/// instruction instead of a call to `fmaf`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_fma() -> bool {
    use std::sync::OnceLock;
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| is_x86_feature_detected!("fma"))
}
