//! x86 CPU feature detection (each probed once): the feature sets of the kernel paths.

use std::sync::OnceLock;

pub(crate) fn has_avx2() -> bool {
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("bmi2")
    })
}

pub(crate) fn has_avx512() -> bool {
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| {
        has_avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// The 512-bit kernels additionally use AVX-512 DQ.
pub(crate) fn has_avx512_zmm() -> bool {
    static F: OnceLock<bool> = OnceLock::new();
    *F.get_or_init(|| has_avx512() && is_x86_feature_detected!("avx512dq"))
}
