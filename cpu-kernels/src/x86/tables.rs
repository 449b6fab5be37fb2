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

/// The IQ3_XXS grid transposed by byte for `vpermi2b`: `[j][idx]` = byte j of entry idx,
/// 4 tables of 256 bytes (each is two 128-byte halves = 4 zmm registers).
#[repr(C, align(64))]
pub(crate) struct Iq3ByteTables(pub [[u8; 256]; 4]);

pub(crate) fn iq3xxs_byte_tables() -> &'static Iq3ByteTables {
    static T: OnceLock<Iq3ByteTables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Iq3ByteTables([[0; 256]; 4]);
        for (idx, &g) in quant::iq3_xxs::IQ3XXS_GRID.iter().enumerate() {
            for (j, b) in g.to_le_bytes().into_iter().enumerate() {
                t.0[j][idx] = b;
            }
        }
        t
    })
}
