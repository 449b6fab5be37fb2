//! The ABI of the MMQ prefill kernels (gpu-kernels ops/mmq.rs): argument struct, tiling and
//! LDS layout. A part of the ABI, re-exported by the crate root; same rules.

use super::*;

/// Arguments of every `mmq_*` kernel (prefill): `y[c * y_stride + i] = W[i] · x[c]` for
/// `ncols` Q8_1 activation columns (`k / 32` blocks each, back to back) and `nrows` weight
/// rows of `k` (a multiple of the type's block size).
///
/// Tiling: a workgroup (8 waves) computes `MMQ_ROWS` (256) rows x `MMQ_COLS` (64) columns;
/// grid = `ceil(nrows / 256) * ceil(ncols / 64)`, workgroup `g` = column tile `g % col_tiles`,
/// row tile `g / col_tiles` (the column tiles of one weight tile are dispatched together). K is walked in chunks of `MMQ_KC` (128) values: the workgroup
/// stages the chunk of its 64 activation columns (quants, `d`, `s`) and of its 256 weight rows,
/// decoded to signed int8 plus one f32 scale per 32 values (Q6_K: per 16) and, for Q4_K, the
/// min `dmin * m` per 32 values, in LDS (`mmq_lds_bytes`); every global byte is read once per
/// workgroup (a K-quant super-block's header / scale once per half). Wave `w` then computes rows `32w..32w+32` for all 64 columns, on
/// `v_wmma_i32_16x16x16_iu8` tiles (`*_wmma`) or with `v_dot4_i32_iu8` (`*_dot4`).
///
/// Accumulation order (both variants, bit-identical to each other): per 32-value block `b` of
/// the row, in increasing `b`, the exact int32 dot `q` of the int8 weights and activations, then
/// - Q8_0 (`ws = d`), IQ3_XXS (`ws = d * (0.5 + (aux >> 28)) * 0.5`):
///   `acc = acc + (q as f32) * (ws * dx)`;
/// - Q4_K (`ws = d * sc`, `wm = dmin * m` of the sub-block): `acc = acc + (q as f32) * (ws * dx)`,
///   then `acc = acc - wm * sx` with `sx` the Q8_1 block's `s` (f16 `d * sum(q)`);
/// - Q6_K: the two 16-value halves separately, `acc = acc + (q_lo as f32) * (ws_lo * dx)`, then
///   the same for the high half (`ws = d * scale_i8`);
///
/// with `dx` = the Q8_1 block's `d`, all f32 operations rounded one at a time (no FMA).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmqArgs {
    pub w: u64,
    pub x: u64,
    pub y: u64,
    pub nrows: u32,
    pub ncols: u32,
    pub k: u32,
    pub y_stride: u32,
}
/// Weight rows per MMQ workgroup (8 waves x 2 x 16).
pub const MMQ_ROWS: u32 = 32 * WAVES_PER_WG;
/// Activation columns per MMQ workgroup (4 WMMA tiles of 16 per wave).
pub const MMQ_COLS: u32 = 64;
/// Values of K staged per chunk (half a K-quant super-block, 4 Q8_0 blocks).
pub const MMQ_KC: u32 = 128;
/// LDS layout of an MMQ workgroup (byte offsets): int8 weights `[step of 16][row][16]`,
/// activations `[step][column][16]`, activation `d` and `s` as f32 `[block of 32][column']`
/// with column' = `16 t + 8 (i % 2) + i / 2` for column `16 t + i` (so each lane reads its 8
/// WMMA output columns as two b128), weight scales f32 `[slot][row]`, Q4_K mins `[block][row]`.
pub const MMQ_WQ: u32 = 0;
pub const MMQ_XQ: u32 = MMQ_WQ + (MMQ_KC / 16) * MMQ_ROWS * 16;
pub const MMQ_XD: u32 = MMQ_XQ + (MMQ_KC / 16) * MMQ_COLS * 16;
pub const MMQ_XS: u32 = MMQ_XD + (MMQ_KC / 32) * MMQ_COLS * 4;
pub const MMQ_WS: u32 = MMQ_XS + (MMQ_KC / 32) * MMQ_COLS * 4;
/// Weight scale slots per staged chunk: one per 16 values for Q6_K, else one per 32.
pub const fn mmq_scale_slots(ty: WType) -> u32 {
    match ty {
        WType::Q6K => MMQ_KC / 16,
        _ => MMQ_KC / 32,
    }
}
/// Offset of the Q4_K mins (after the scales).
pub const fn mmq_wm_offset(ty: WType) -> u32 {
    MMQ_WS + mmq_scale_slots(ty) * MMQ_ROWS * 4
}
/// Dynamic LDS of an MMQ launch (IQ3_XXS also has its 3 KiB of static tables).
pub const fn mmq_lds_bytes(ty: WType) -> u32 {
    mmq_wm_offset(ty)
        + match ty {
            WType::Q4K => (MMQ_KC / 32) * MMQ_ROWS * 4,
            _ => 0,
        }
}
const _: () = assert!(mmq_lds_bytes(WType::Q4K) <= MAX_LDS_BYTES);
const _: () = assert!(mmq_lds_bytes(WType::Q6K) <= MAX_LDS_BYTES);
const _: () = assert!(mmq_lds_bytes(WType::IQ3XXS) + IQ3_GRID_LDS_BYTES + IQ3_SIGNS_LDS_BYTES <= MAX_LDS_BYTES);
