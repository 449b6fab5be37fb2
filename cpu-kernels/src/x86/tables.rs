//! Lookup tables used by the SIMD kernels, all derived from `quant`'s format tables (never
//! restated here).

use std::sync::OnceLock;

/// IQ4_NL's 16 signed levels (a `vpshufb` table).
pub(crate) static IQ4NL_VALUES: [i8; 16] = quant::iq4_nl::KVALUES_IQ4NL;

/// IQ3_XXS grid: entry i = 4 magnitudes as little-endian bytes.
#[inline(always)]
pub(crate) fn iq3xxs_grid() -> &'static [u32; 256] {
    &quant::iq3_xxs::IQ3XXS_GRID
}

/// The eight magnitudes an IQ3_XXS grid byte can take.
pub(crate) const IQ3_LEVELS: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];

/// The IQ3_XXS grid as two 256-byte tables of 3-bit level codes, for `vpermi2b`:
/// `codes[h][idx] = code(byte 2h of entry idx) | code(byte 2h+1) << 3`, where code(v) is v's
/// index in [`IQ3_LEVELS`]. Two lookups (instead of four) give all 4 bytes of 64 entries.
#[repr(C, align(64))]
pub(crate) struct Iq3Codes(pub [[u8; 256]; 2]);

/// `None` if some grid byte is not one of [`IQ3_LEVELS`] (then the kernel is not used).
pub(crate) fn iq3xxs_codes() -> Option<&'static Iq3Codes> {
    static T: OnceLock<Option<Iq3Codes>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Iq3Codes([[0; 256]; 2]);
        let code = |v: u8| IQ3_LEVELS.iter().position(|&l| l == v).map(|c| c as u8);
        for (idx, &g) in quant::iq3_xxs::IQ3XXS_GRID.iter().enumerate() {
            let b = g.to_le_bytes();
            for h in 0..2 {
                t.0[h][idx] = code(b[2 * h])? | (code(b[2 * h + 1])? << 3);
            }
        }
        Some(t)
    })
    .as_ref()
}
