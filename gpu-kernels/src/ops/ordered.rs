//! Ordered-numerics kernels (`GpuOptions::ordered`, docs/amd-hip.md): every lane runs the very
//! same `no_std` scalar code of the `quant` crate that the CPU backend's ordered path runs, so
//! both backends produce the same bits (Rust never contracts `a * b + c` into an FMA, IEEE
//! `+ - * /` and the int/f16/f64 conversions are correctly rounded on both).
//!
//! - `quantize_ref`: activations to the weight type's `vec_dot_type` with the reference
//!   quantizer (`q8_0/q8_1/q8_k::quantize_ref`, `float::quantize_f16/bf16/f32`, exactly what
//!   `quant::quantize_row` dispatches to), one work-item per block;
//! - `mmv_ordered`: `y[c][r] = quant::vec_dot(ty, k, W[r], a[c])`, one work-item per
//!   (row, column): integer sums inside blocks, f32 (F32/F16/BF16: f64) accumulation across
//!   blocks in block order, as `quant::vec_dot`;
//! - `geglu_table_f32`: `cpu_kernels::geglu_ggml` with its f16 GELU table uploaded.
//!
//! Slow by design (no reuse of weights across columns, byte loads): a parity mode.
use crate::abi::WG_SIZE;
use crate::arch::{group_id, thread_id};
use crate::mem::f32_to_f16;
use quant::GgmlType;
use quant::block::Block;

#[inline(always)]
fn gid() -> u32 {
    group_id() * WG_SIZE + thread_id()
}

/// `q_blocks` of `quant::quantize_row` for one block: `f(x).write(dst)`.
#[inline(always)]
fn q_block<B: Block, const QK: usize>(src: &[f32], dst: &mut [u8], f: fn(&[f32; QK]) -> B) {
    if let Ok(x) = <&[f32; QK]>::try_from(src) {
        f(x).write(dst);
    }
}

/// One block of `n` f32 (several columns back to back) to `ty` (an activation type: Q8_0,
/// Q8_1, Q8_K, F16, BF16 or F32) per work-item.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn quantize_ref(x: *const f32, y: *mut u8, n: u32, ty: u32) {
    let Some(t) = GgmlType::from_u32(ty) else { return };
    let (qk, bs) = (t.block_size() as u32, t.type_size() as u32);
    let b = gid();
    if qk == 0 || b >= n / qk {
        return;
    }
    // SAFETY: ABI (abi::QuantizeRefArgs): x holds n f32, y holds n / qk blocks of bs bytes;
    // block b is this work-item's alone.
    let (src, dst) = unsafe {
        (
            core::slice::from_raw_parts(x.add((b * qk) as usize), qk as usize),
            core::slice::from_raw_parts_mut(y.add((b * bs) as usize), bs as usize),
        )
    };
    match t {
        GgmlType::Q8_0 => q_block(src, dst, quant::q8_0::quantize_ref),
        GgmlType::Q8_1 => q_block(src, dst, quant::q8_1::quantize_ref),
        GgmlType::Q8K => q_block(src, dst, quant::q8_k::quantize_ref),
        GgmlType::F16 => quant::float::quantize_f16(src, dst),
        GgmlType::BF16 => quant::float::quantize_bf16(src, dst),
        GgmlType::F32 => quant::float::quantize_f32(src, dst),
        _ => {}
    }
}

/// `y[c * nrows + r] = quant::vec_dot(ty, k, W[r], a[c])` for `r < nrows`, `c < ncols`; `W`
/// rows of `ty`, `a` columns of `ty.vec_dot_type()`. One work-item per (row, column), rows
/// fastest. A type without a reference dot writes NaN.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn mmv_ordered(
    w: *const u8,
    a: *const u8,
    y: *mut f32,
    nrows: u32,
    ncols: u32,
    k: u32,
    ty: u32,
) {
    let g = gid();
    if nrows == 0 || g >= nrows * ncols {
        return;
    }
    let Some(t) = GgmlType::from_u32(ty) else { return };
    let (Some(wb), Some(ab)) = (t.row_bytes(k as usize), t.vec_dot_type().row_bytes(k as usize)) else { return };
    let (r, c) = ((g % nrows) as usize, (g / nrows) as usize);
    // SAFETY: ABI (abi::MmvOrderedArgs): W holds nrows rows of wb bytes, a holds ncols columns
    // of ab bytes, y holds ncols * nrows f32; cell (c, r) is this work-item's alone.
    unsafe {
        let wr = core::slice::from_raw_parts(w.add(r * wb), wb);
        let ar = core::slice::from_raw_parts(a.add(c * ab), ab);
        *y.add(c * nrows as usize + r) = quant::vec_dot(t, k as usize, wr, ar).unwrap_or(f32::NAN);
    }
}

/// `out[i] = gelu(gate[i]) * up[i]` as `cpu_kernels::geglu_ggml`: 0 for gate <= -10, `gate *
/// up` for gate >= 10, else `table[f16(gate)] * up` (table: 65536 f32 from
/// `cpu_kernels::gelu_f16_table`).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn geglu_table_f32(
    gate: *const f32,
    up: *const f32,
    out: *mut f32,
    table: *const f32,
    n: u32,
    _pad: u32,
) {
    let i = gid();
    if i >= n {
        return;
    }
    // SAFETY: ABI (abi::GegluTableArgs): three buffers of n f32, a table of 65536 f32;
    // element i is this item's.
    unsafe {
        let (g, u) = (*gate.add(i as usize), *up.add(i as usize));
        *out.add(i as usize) = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            *table.add(f32_to_f16(g) as usize) * u
        };
    }
}
