//! `GpuOps` (gpu-executor/src/ops.rs), one test body per op, written once with `test_device!`:
//! it computes the CPU reference and runs the op on one device, as `<name>::emu` (the software
//! RDNA3 device, always) and `<name>::hip` (a real gfx11 GPU whenever `open_device(Device::Hip)`
//! opens one; otherwise it prints why and passes), so the report says which device ran what.
//! Bitwise where the contract says so, otherwise within the named tolerances below. Random
//! inputs plus edge shapes (one row, remainders, head_dim 16..256, window cutting, GQA, int8 KV,
//! verification windows of 8 tokens).

use quant::GgmlType;
use strata::cpu::prelude::*;
use strata::gpu::abi::{self, WType};
use strata::gpu::device::{DevicePtr, Stream};
use strata::gpu::ops::{GluAct, GpuOps, RowType};
use strata::kernel_tools::bench::{random_blocks, random_routing};
use strata::rng::SplitMix64;
use strata::test_device;
// The references and tolerances shared with `strata device --selftest`: GLU_TOL (SiLU/GELU
// against libm, relative with a floor of 1), PROB_TOL (softmax / router probabilities,
// absolute), FAST_ATTN_TOL (WMMA f16 attention against `attend`, absolute, |V| ~ 1).
use strata::kernel_tools::selftest::reference::{GLU_TOL, PROB_TOL, q8_0_scalar_order, router_reference};

/// `attend_ordered` (f32, expf) against the CPU `attend` (libm exp, f64 sums): absolute.
pub(crate) const ORDERED_VS_ATTEND_TOL: f32 = 2e-5;

/// `emu` or `hip`, for messages.
pub(crate) fn device_name(ops: &GpuOps) -> &'static str {
    ops.api().info().backend.name()
}

/// A device buffer freed on drop.
pub(crate) struct Buf<'a> {
    ops: &'a GpuOps,
    pub(crate) ptr: DevicePtr,
    len: usize,
}
impl Drop for Buf<'_> {
    fn drop(&mut self) {
        let _ = self.ops.api().free(self.ptr);
    }
}
impl Buf<'_> {
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let api = self.ops.api();
        api.synchronize().expect("synchronize");
        let mut v = vec![0u8; self.len];
        api.memcpy_dtoh(&mut v, self.ptr).expect("dtoh");
        v
    }
    pub(crate) fn f32s(&self) -> Vec<f32> {
        self.bytes().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    pub(crate) fn u32s(&self) -> Vec<u32> {
        self.bytes().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}
pub(crate) fn up<'a>(ops: &'a GpuOps, bytes: &[u8]) -> Buf<'a> {
    let api = ops.api();
    let ptr = api.malloc(bytes.len().max(16)).expect("malloc");
    api.memcpy_htod(ptr, bytes).expect("htod");
    Buf { ops, ptr, len: bytes.len() }
}
pub(crate) fn zeros(ops: &GpuOps, n: usize) -> Buf<'_> {
    up(ops, &vec![0u8; n])
}
pub(crate) fn upf<'a>(ops: &'a GpuOps, v: &[f32]) -> Buf<'a> {
    up(ops, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}
pub(crate) fn upu<'a>(ops: &'a GpuOps, v: &[u32]) -> Buf<'a> {
    up(ops, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}
pub(crate) fn ggml(ty: WType) -> GgmlType {
    GgmlType::from_u32(ty.ggml_id()).expect("ggml type")
}
/// Asserts `|got − want| <= tol · max(1, |want|)` element by element (finite values) and
/// returns the largest such relative error, for the printed measurement.
pub(crate) fn assert_rel_floor1(dev: &str, what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{dev} {what}: length");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{dev} {what}: element {i} is {g}");
        let e = (g - w).abs() / w.abs().max(1.0);
        assert!(e <= tol, "{dev} {what}: element {i}: gpu {g:e} cpu {w:e} (rel {e:e} > {tol:e})");
        worst = worst.max(e);
    }
    worst
}
pub(crate) fn assert_bits(dev: &str, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{dev} {what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{dev} {what}: element {i}: gpu {g:e} ({:#x}) cpu {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}
pub(crate) const S: Stream = Stream::DEFAULT;

// ---------------------------------------------------------------- existing kernels via GpuOps

test_device!(
    fn gpu_ops_quantize_q8_1_and_q8_k_byte_exact(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(1);
        for n in [256usize, 4096 * 3] {
            let mut x = rng.symmetric_vec(n, 3.0);
            x[5] = 0.0;
            x[..32].fill(0.0); // an all-zero block
            let xb = upf(ops, &x);
            let y1 = zeros(ops, n / 32 * 36);
            ops.quantize_q8_1(&S, xb.ptr, y1.ptr, n as u32).unwrap();
            let mut want = vec![0u8; n / 32 * 36];
            quant::quantize_row(GgmlType::Q8_1, &x, &mut want).unwrap();
            assert_eq!(y1.bytes(), want, "{name} q8_1 n={n}");
            let yk = zeros(ops, n / 256 * 292);
            ops.quantize_q8_k(&S, xb.ptr, yk.ptr, n as u32).unwrap();
            let mut want = vec![0u8; n / 256 * 292];
            quant::quantize_row(GgmlType::Q8K, &x, &mut want).unwrap();
            assert_eq!(yk.bytes(), want, "{name} q8_k n={n}");
        }
        assert!(ops.quantize_q8_1(&S, 0, 0, 33).is_err());
        assert!(ops.quantize_q8_k(&S, 0, 0, 0).is_err());
    }
);

test_device!(
    fn gpu_ops_dequant_bit_exact(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(2);
        for ty in WType::ALL {
            for nblocks in [1usize, 37, 300] {
                let w = random_blocks(ty, nblocks, &mut rng);
                let n = nblocks * ty.block_k() as usize;
                let mut want = vec![0f32; n];
                quant::dequantize_row(ggml(ty), &w, &mut want).unwrap();
                let wb = up(ops, &w);
                let y = zeros(ops, n * 4);
                ops.dequant(&S, ty, false, wb.ptr, y.ptr, nblocks as u32).unwrap();
                assert_bits(name, &format!("dequant {ty:?} x{nblocks}"), &y.f32s(), &want);
                let yh = zeros(ops, n * 2);
                ops.dequant(&S, ty, true, wb.ptr, yh.ptr, nblocks as u32).unwrap();
                let got: Vec<u16> = yh.bytes().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                let wanth: Vec<u16> = want.iter().map(|&v| quant::f32_to_f16(v)).collect();
                assert_eq!(got, wanth, "{name} dequant f16 {ty:?} x{nblocks}");
            }
        }
    }
);

test_device!(
    /// MMVQ through GpuOps, 1 and 8 columns (and the split of columns that do not fit LDS), with
    /// tests/gpu/gpu_kernels.rs' tolerance: relative to sum |w a| of the dequantized operands.
    fn gpu_ops_mmvq_1_and_8_columns(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(3);
        for ty in WType::ALL {
            for (nrows, k, ncols, rowsel) in [(1usize, 256usize, 1usize, false), (200, 1024, 1, false), (130, 512, 8, false), (64, 512, 1, true), (16, 8192, 9, false)] {
                let ncols_ok = ncols.min(8);
                let bk = ty.block_k() as usize;
                let row_bytes = k / bk * ty.block_bytes() as usize;
                let w = random_blocks(ty, nrows * k / bk, &mut rng);
                let x = rng.symmetric_vec(ncols_ok * k, 1.0);
                let mut xq = vec![0u8; ncols_ok * k / 32 * 36];
                quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
                let ids: Vec<u32> = if rowsel { (0..nrows as u32).rev().step_by(3).collect() } else { (0..nrows as u32).collect() };
                let (wb, xb) = (up(ops, &w), up(ops, &xq));
                let rb = upu(ops, &ids);
                let y_stride = ids.len() as u32 + 3;
                let y = zeros(ops, ncols_ok * y_stride as usize * 4);
                let r = ops.mmvq(&S, ty, ncols as u32, wb.ptr, xb.ptr, y.ptr, rowsel.then_some(rb.ptr), ids.len() as u32, k as u32, y_stride);
                if ncols > 8 {
                    assert!(r.is_err(), "{name}: 9 columns must be refused");
                    continue;
                }
                r.unwrap_or_else(|e| panic!("{name} mmvq {ty:?}: {e}"));
                let yv = y.f32s();
                let mut a = vec![0f32; k];
                let mut wr = vec![0f32; k];
                for c in 0..ncols {
                    quant::dequantize_row(GgmlType::Q8_1, &xq[c * k / 32 * 36..(c + 1) * k / 32 * 36], &mut a).unwrap();
                    for (i, &rw) in ids.iter().enumerate() {
                        quant::dequantize_row(ggml(ty), &w[rw as usize * row_bytes..(rw as usize + 1) * row_bytes], &mut wr).unwrap();
                        let (dot, mag) = wr.iter().zip(&a).fold((0f64, 0f64), |(d, m), (&p, &q)| (d + p as f64 * q as f64, m + (p as f64 * q as f64).abs()));
                        let got = yv[c * y_stride as usize + i] as f64;
                        let tol = if ty == WType::Q4K { 1e-4 } else { 1e-6 };
                        assert!((got - dot).abs() <= tol * (mag + 1e-30), "{name} {ty:?} k={k} col {c} row {i}: {got} vs {dot}");
                    }
                }
            }
            // Column split: 8 columns of k = 8192 do not fit 64 KiB of LDS together.
            let k = 8192usize;
            let bk = ty.block_k() as usize;
            let w = random_blocks(ty, 4 * k / bk, &mut rng);
            let x = rng.symmetric_vec(8 * k, 1.0);
            let mut xq = vec![0u8; 8 * k / 32 * 36];
            quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
            let (wb, xb) = (up(ops, &w), up(ops, &xq));
            let y = zeros(ops, 8 * 4 * 4);
            ops.mmvq(&S, ty, 8, wb.ptr, xb.ptr, y.ptr, None, 4, k as u32, 4).unwrap();
            let yv = y.f32s();
            let mut a = vec![0f32; k];
            let mut wr = vec![0f32; k];
            let row_bytes = k / bk * ty.block_bytes() as usize;
            for c in 0..8 {
                quant::dequantize_row(GgmlType::Q8_1, &xq[c * k / 32 * 36..(c + 1) * k / 32 * 36], &mut a).unwrap();
                for i in 0..4 {
                    quant::dequantize_row(ggml(ty), &w[i * row_bytes..(i + 1) * row_bytes], &mut wr).unwrap();
                    let (dot, mag) = wr.iter().zip(&a).fold((0f64, 0f64), |(d, m), (&p, &q)| (d + p as f64 * q as f64, m + (p as f64 * q as f64).abs()));
                    let tol = if ty == WType::Q4K { 1e-4 } else { 1e-6 };
                    assert!((yv[c * 4 + i] as f64 - dot).abs() <= tol * mag, "{name} {ty:?} split col {c} row {i}");
                }
            }
        }
    }
);

// ---------------------------------------------------------------- forward-pass ops

test_device!(
    fn gpu_ops_rms_norm_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(4);
        for (n, rows) in [(4096usize, 1usize), (100, 3), (7, 2), (2560, 9)] {
            let x = rng.symmetric_vec(n * rows, 4.0);
            let w = rng.symmetric_vec(n, 2.0);
            let eps = 1e-6;
            for ggml in [false, true] {
                let mut want = vec![0f32; n * rows];
                for r in 0..rows {
                    let f = if ggml { cpu_kernels::rms_norm_ggml } else { cpu_kernels::rms_norm };
                    f(&x[r * n..(r + 1) * n], &w, eps, &mut want[r * n..(r + 1) * n]);
                }
                let (xb, wb) = (upf(ops, &x), upf(ops, &w));
                let y = zeros(ops, n * rows * 4);
                let f = if ggml { GpuOps::rms_norm_ggml } else { GpuOps::rms_norm };
                f(ops, &S, xb.ptr, wb.ptr, y.ptr, n as u32, rows as u32, eps).unwrap();
                assert_bits(name, &format!("rms_norm ggml={ggml} n={n} rows={rows}"), &y.f32s(), &want);
                // In place (y == x).
                f(ops, &S, xb.ptr, wb.ptr, xb.ptr, n as u32, rows as u32, eps).unwrap();
                assert_bits(name, &format!("rms_norm in place ggml={ggml} n={n}"), &xb.f32s(), &want);
            }
        }
    }
);

test_device!(
    fn gpu_ops_rope_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(5);
        for (hd, rd, nh, nt) in [(64usize, 64usize, 4usize, 1usize), (128, 128, 2, 3), (128, 64, 3, 2), (256, 256, 1, 8), (32, 32, 4, 5)] {
            let (base, fscale) = (10000.0f32, 1.0f32);
            let n_pos = 300;
            let pos: Vec<u32> = (0..nt).map(|i| if i == 0 { n_pos as u32 - 1 } else { (rng.next_u64() % n_pos as u64) as u32 }).collect();
            let x = rng.symmetric_vec(nt * nh * hd, 2.0);
            for (neox, fma) in [(true, false), (false, false), (true, true)] {
                let table = if fma { GpuOps::rope_table_ggml(base, fscale, rd, n_pos) } else { GpuOps::rope_table(base, fscale, rd, n_pos) };
                let mut want = x.clone();
                for (t, &p) in pos.iter().enumerate() {
                    let xt = &mut want[t * nh * hd..(t + 1) * nh * hd];
                    let f = match (neox, fma) {
                        (true, true) => cpu_kernels::rope_neox_ggml,
                        (true, false) => cpu_kernels::rope_neox,
                        _ => cpu_kernels::rope_norm,
                    };
                    f(xt, nh, hd, rd, p as usize, base, fscale);
                }
                let xb = upf(ops, &x);
                let (pb, tb) = (upu(ops, &pos), upf(ops, &table));
                ops.rope(&S, xb.ptr, pb.ptr, tb.ptr, nt as u32, nh as u32, hd as u32, rd as u32, neox, fma).unwrap();
                assert_bits(name, &format!("rope hd={hd} rd={rd} neox={neox} fma={fma}"), &xb.f32s(), &want);
            }
        }
        assert!(ops.rope(&S, 0, 0, 0, 1, 1, 64, 65, true, false).is_err(), "odd rope_dim refused");
        assert!(ops.rope(&S, 0, 0, 0, 1, 1, 64, 128, true, false).is_err(), "rope_dim > head_dim refused");
    }
);

test_device!(
    fn gpu_ops_glu_within_tolerance(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(6);
        for n in [1usize, 1000, 8192] {
            let mut g = rng.symmetric_vec(n, 12.0);
            if n > 10 {
                g[..6].copy_from_slice(&[0.0, -0.0, 30.0, -30.0, 1e-8, -95.0]);
            }
            let u = rng.symmetric_vec(n, 3.0);
            for act in [GluAct::Silu, GluAct::GeluTanh] {
                let mut want = vec![0f32; n];
                match act {
                    GluAct::Silu => cpu_kernels::swiglu(&g, &u, &mut want),
                    GluAct::GeluTanh => cpu_kernels::geglu(&g, &u, &mut want),
                }
                let (gb, ub) = (upf(ops, &g), upf(ops, &u));
                let o = zeros(ops, n * 4);
                ops.glu(&S, gb.ptr, ub.ptr, o.ptr, n as u32, act).unwrap();
                let mut worst = 0f32;
                for (i, (a, b)) in o.f32s().iter().zip(&want).enumerate() {
                    let e = (a - b).abs() / b.abs().max(1.0);
                    worst = worst.max(e);
                    assert!(e as f64 <= GLU_TOL, "{name} {act:?} n={n} [{i}] gate {}: gpu {a} cpu {b}", g[i]);
                }
                println!("{name} glu {act:?} n={n}: worst {worst:.2e}");
            }
        }
    }
);

test_device!(
    /// `convert_f32_f16` / `convert_f32_bf16` equal `quant::f32_to_f16` / `f32_to_bf16` bit for
    /// bit: random values of every magnitude plus ties, subnormals, overflow, ±0, ±inf and NaN.
    fn gpu_ops_convert_f16_and_bf16_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(17);
        let mut x: Vec<f32> = (0..4000).map(|i| rng.symmetric() * 2f32.powi(i % 60 - 30)).collect();
        x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 65504.0, 65520.0, 1e-8, -6e-5, 3.4e38]);
        // Exact ties: halfway between two bf16 / f16 values (round to even both ways).
        x.extend([f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000), f32::from_bits(0x3f80_1000), f32::from_bits(0x3f80_3000)]);
        x.extend([f32::from_bits(0x7fc0_0001), f32::from_bits(0xff80_0001)]); // NaN payloads
        let n = x.len();
        let xb = upf(ops, &x);
        let y = zeros(ops, n * 2);
        for (what, bf) in [("f16", false), ("bf16", true)] {
            if bf {
                ops.convert_f32_bf16(&S, xb.ptr, y.ptr, n as u32).unwrap();
            } else {
                ops.convert_f32_f16(&S, xb.ptr, y.ptr, n as u32).unwrap();
            }
            let got: Vec<u16> = y.bytes().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
            for (i, &v) in x.iter().enumerate() {
                let want = if bf { quant::f32_to_bf16(v) } else { quant::f32_to_f16(v) };
                assert_eq!(got[i], want, "{name} {what} of {v:e} ({:#x}) [{i}]", v.to_bits());
            }
        }
    }
);

test_device!(
    fn gpu_ops_add_rows_and_scale_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(7);
        for (n, rows, stride) in [(1usize, 1usize, 1usize), (300, 4, 300), (64, 3, 0), (100, 2, 128)] {
            let x = rng.symmetric_vec(n * rows, 5.0);
            let b = rng.symmetric_vec(stride * rows + n, 5.0);
            let mut want = x.clone();
            for r in 0..rows {
                for i in 0..n {
                    want[r * n + i] += b[r * stride + i];
                }
            }
            let (xb, bb) = (upf(ops, &x), upf(ops, &b));
            ops.add_rows(&S, xb.ptr, bb.ptr, n as u32, rows as u32, stride as u32).unwrap();
            assert_bits(name, &format!("add_rows n={n} rows={rows} stride={stride}"), &xb.f32s(), &want);
            ops.scale(&S, xb.ptr, (n * rows) as u32, 0.3).unwrap();
            let want: Vec<f32> = want.iter().map(|v| v * 0.3).collect();
            assert_bits(name, "scale", &xb.f32s(), &want);
        }
    }
);

test_device!(
    fn gpu_ops_softmax_within_tolerance(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(8);
        for (n, rows) in [(1usize, 1usize), (37, 3), (4096, 2), (151, 9)] {
            let mut x = rng.symmetric_vec(n * rows, 20.0);
            if n > 4 {
                x[1] = f32::NEG_INFINITY; // masked entry
            }
            let mut want = x.clone();
            want.chunks_mut(n).for_each(cpu_kernels::softmax);
            let xb = upf(ops, &x);
            ops.softmax(&S, xb.ptr, n as u32, rows as u32).unwrap();
            for (i, (a, b)) in xb.f32s().iter().zip(&want).enumerate() {
                assert!(((a - b).abs() as f64) <= PROB_TOL, "{name} softmax n={n} [{i}]: gpu {a} cpu {b}");
            }
        }
        // A fully masked row becomes zeros, as on the CPU.
        let xb = upf(ops, &[f32::NEG_INFINITY; 5]);
        ops.softmax(&S, xb.ptr, 5, 1).unwrap();
        assert_eq!(xb.f32s(), vec![0.0; 5], "{name}");
    }
);

test_device!(
    fn gpu_ops_get_rows_bit_exact(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(9);
        let ids: Vec<u32> = vec![3, 0, 7, 3, 1];
        let nrows = 8usize;
        for scale in [1.0f32, 2.5] {
            for ty in WType::ALL {
                let k = 512usize;
                let bk = ty.block_k() as usize;
                let row_bytes = k / bk * ty.block_bytes() as usize;
                let table = random_blocks(ty, nrows * k / bk, &mut rng);
                let mut want = vec![0f32; ids.len() * k];
                for (i, &r) in ids.iter().enumerate() {
                    let o = &mut want[i * k..(i + 1) * k];
                    quant::dequantize_row(ggml(ty), &table[r as usize * row_bytes..(r as usize + 1) * row_bytes], o).unwrap();
                    if scale != 1.0 {
                        o.iter_mut().for_each(|v| *v *= scale);
                    }
                }
                let (tb, ib) = (up(ops, &table), upu(ops, &ids));
                let o = zeros(ops, want.len() * 4);
                ops.get_rows(&S, RowType::W(ty), tb.ptr, ib.ptr, ids.len() as u32, k as u32, o.ptr, scale).unwrap();
                assert_bits(name, &format!("get_rows {ty:?} scale {scale}"), &o.f32s(), &want);
            }
            let k = 40usize;
            let tf = rng.symmetric_vec(nrows * k, 3.0);
            let th: Vec<u16> = tf.iter().map(|&v| quant::f32_to_f16(v)).collect();
            for f16 in [false, true] {
                let mut want = vec![0f32; ids.len() * k];
                for (i, &r) in ids.iter().enumerate() {
                    for j in 0..k {
                        let v = if f16 { quant::f16_to_f32(th[r as usize * k + j]) } else { tf[r as usize * k + j] };
                        want[i * k + j] = if scale != 1.0 { v * scale } else { v };
                    }
                }
                let tb = if f16 { up(ops, &th.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()) } else { upf(ops, &tf) };
                let ib = upu(ops, &ids);
                let o = zeros(ops, want.len() * 4);
                let ty = if f16 { RowType::F16 } else { RowType::F32 };
                ops.get_rows(&S, ty, tb.ptr, ib.ptr, ids.len() as u32, k as u32, o.ptr, scale).unwrap();
                assert_bits(name, &format!("get_rows {ty:?} scale {scale}"), &o.f32s(), &want);
            }
        }
        assert!(ops.get_rows(&S, RowType::W(WType::Q4K), 0, 0, 1, 100, 0, 1.0).is_err());
    }
);

test_device!(
    fn gpu_ops_moe_router_matches_cpu(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(13);
        for (ne, k, nt, renorm) in [(8usize, 2usize, 1usize, true), (128, 8, 5, true), (60, 4, 3, false), (256, 8, 2, true), (4, 4, 1, true), (512, 10, 3, true), (300, 16, 2, false)] {
            let mut logits = rng.symmetric_vec(nt * ne, 4.0);
            if ne > 8 {
                // exact ties: lower index first
                logits[3] = 9.0;
                logits[7] = 9.0;
                logits[5] = 9.0;
            }
            // softmax (cpu_kernels), moe::top_k (ties to the lower index), renorm clamped at
            // 6.103515625e-5, per token.
            let (want_ids, want_w) = router_reference(&logits, ne, k, renorm);
            let lb = upf(ops, &logits);
            let (ib, wb) = (zeros(ops, nt * k * 4), zeros(ops, nt * k * 4));
            ops.moe_router(&S, lb.ptr, ib.ptr, wb.ptr, nt as u32, ne as u32, k as u32, renorm).unwrap();
            assert_eq!(ib.u32s(), want_ids, "{name} router ids ne={ne} k={k}");
            for (a, b) in wb.f32s().iter().zip(&want_w) {
                assert!(((a - b).abs() as f64) <= PROB_TOL, "{name} router weight {a} vs {b}");
            }
        }
        assert!(ops.moe_router(&S, 0, 0, 0, 1, 513, 8, true).is_err());
        assert!(ops.moe_router(&S, 0, 0, 0, 1, 8, 9, true).is_err());
        assert!(ops.moe_router(&S, 0, 0, 0, 1, 512, 17, true).is_err());
    }
);

test_device!(
    /// Flash-Next's routing (512 experts, top-10, renormalised) against its own CPU router,
    /// `qwen4exp::moe::Moe::route`: the same experts in the same order, weights within PROB_TOL.
    fn gpu_ops_moe_router_matches_qwen4exp_route(ops) {
        use strata::model::Mat;
        use strata::model::qwen4exp::moe::{Moe, SwiGlu};
        let name = device_name(ops);
        let unused = || Mat::from_f32(1, 1, &[0.0]).unwrap();
        let moe = Moe { spec: strata::model::qwen4exp::moe::spec(512, 10, 1, 1), router: unused(), experts: Vec::new(), shared_gate: unused(), shared: SwiGlu { gate: unused(), up: unused(), down: unused() } };
        let (ne, nt) = (512usize, 4usize);
        let mut rng = SplitMix64::new(15);
        let mut logits = rng.symmetric_vec(nt * ne, 6.0);
        logits[100] = 9.0; // exact ties in token 0: lower index first
        logits[40] = 9.0;
        let lb = upf(ops, &logits);
        let (ib, wb) = (zeros(ops, nt * 10 * 4), zeros(ops, nt * 10 * 4));
        ops.moe_router(&S, lb.ptr, ib.ptr, wb.ptr, nt as u32, ne as u32, 10, true).unwrap();
        let (ids, ws) = (ib.u32s(), wb.f32s());
        for t in 0..nt {
            let want = moe.route(&logits[t * ne..(t + 1) * ne]);
            let got_ids: Vec<usize> = ids[t * 10..(t + 1) * 10].iter().map(|&i| i as usize).collect();
            assert_eq!(got_ids, want.iter().map(|r| r.0).collect::<Vec<_>>(), "{name} token {t} experts");
            for (j, (&g, &(_, w))) in ws[t * 10..(t + 1) * 10].iter().zip(&want).enumerate() {
                assert!(((g - w).abs() as f64) <= PROB_TOL, "{name} token {t} rank {j}: weight {g} vs {w}");
            }
        }
    }
);

test_device!(
    fn gpu_ops_moe_combine_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(14);
        for (d, nt, k, ny) in [(64usize, 1usize, 2usize, 4usize), (300, 5, 8, 40), (1, 3, 1, 3)] {
            let y = rng.symmetric_vec(ny * d, 2.0);
            let map: Vec<u32> = (0..nt * k).map(|_| (rng.next_u64() % ny as u64) as u32).collect();
            let w = rng.symmetric_vec(nt * k, 1.0);
            let mut want = vec![0f32; nt * d];
            for t in 0..nt {
                for j in 0..k {
                    let (m, wj) = (map[t * k + j] as usize, w[t * k + j]);
                    for i in 0..d {
                        want[t * d + i] += wj * y[m * d + i];
                    }
                }
            }
            let (yb, mb, wb) = (upf(ops, &y), upu(ops, &map), upf(ops, &w));
            let ob = zeros(ops, nt * d * 4);
            ops.moe_combine(&S, yb.ptr, mb.ptr, wb.ptr, ob.ptr, d as u32, nt as u32, k as u32).unwrap();
            assert_bits(name, &format!("moe_combine d={d} k={k}"), &ob.f32s(), &want);
        }
    }
);

test_device!(
    /// The fused gate/up MMVQ + GLU launch equals MMVQ(gate), MMVQ(up) and GLU on the same
    /// device bit for bit (same dot order, same `quant::fmath` activation), for every type, 1..8
    /// columns, row lists, and both activations.
    fn gpu_ops_mmvq_glu_fused_equals_unfused(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(15);
        for ty in WType::ALL {
            for (nrows, k, ncols, rowsel, act) in
                [(70usize, 512usize, 1u32, false, GluAct::Silu), (33, 256, 8, false, GluAct::GeluTanh), (40, 1024, 3, true, GluAct::Silu)]
            {
                let bk = ty.block_k() as usize;
                let wg = random_blocks(ty, nrows * k / bk, &mut rng);
                let wu = random_blocks(ty, nrows * k / bk, &mut rng);
                let x = rng.symmetric_vec(ncols as usize * k, 1.0);
                let mut xq = vec![0u8; ncols as usize * k / 32 * 36];
                quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
                let ids: Vec<u32> = if rowsel { (0..nrows as u32).rev().step_by(2).collect() } else { (0..nrows as u32).collect() };
                let n = ids.len() as u32;
                let (gb, ub, xb, rb) = (up(ops, &wg), up(ops, &wu), up(ops, &xq), upu(ops, &ids));
                let rows = rowsel.then_some(rb.ptr);
                let total = (ncols * n) as usize;
                let (yg, yu, ya, yf) = (zeros(ops, total * 4), zeros(ops, total * 4), zeros(ops, total * 4), zeros(ops, total * 4));
                ops.mmvq(&S, ty, ncols, gb.ptr, xb.ptr, yg.ptr, rows, n, k as u32, n).unwrap();
                ops.mmvq(&S, ty, ncols, ub.ptr, xb.ptr, yu.ptr, rows, n, k as u32, n).unwrap();
                ops.glu(&S, yg.ptr, yu.ptr, ya.ptr, total as u32, act).unwrap();
                ops.mmvq_glu(&S, ty, ncols, gb.ptr, ub.ptr, xb.ptr, yf.ptr, rows, n, k as u32, n, act).unwrap();
                assert_bits(name, &format!("mmvq_glu {ty:?} ncols={ncols} {act:?}"), &yf.f32s(), &ya.f32s());
            }
        }
    }
);

/// Relative tolerance of MMQ against the f64 dot of quant's dequantized weights and Q8_1
/// activations, as a fraction of sum |w_i * a_i| (as MMVQ, tests/gpu/gpu_kernels.rs): exact int32
/// block dots scaled and added in f32; Q4_K's min term uses the Q8_1 block sum `s` stored as
/// f16 (2^-11 relative on that term).
fn mmq_tolerance(ty: WType) -> f64 {
    match ty {
        WType::Q4K => 1e-4,
        _ => 1e-6,
    }
}

test_device!(
    /// MMQ, both variants (int8 WMMA and dot4), every weight type, ragged shapes (rows and
    /// columns that are not multiples of the 256 x 64 tile or of 16, two row and two column tiles,
    /// K with a partial 128-chunk for Q8_0): WMMA and dot4 bit-identical; Q8_0 bitwise against a scalar CPU reference in the
    /// documented order (per 32-block the exact integer dot, `acc = acc + dot as f32 * (d_w * d_x)`);
    /// every type within `mmq_tolerance` of the f64 dot of quant's dequantized operands.
    fn gpu_ops_mmq_all_types_wmma_dot4(ops) {
        let name = device_name(ops);
        use strata::gpu::ops::MmqVariant;
        let mut rng = SplitMix64::new(16);
        for ty in WType::ALL {
            let shapes: &[(usize, usize, usize)] = if ty == WType::Q8_0 {
                &[(16, 16, 32), (200, 37, 256), (5, 3, 96), (130, 70, 1056), (300, 65, 160)]
            } else {
                &[(5, 3, 256), (200, 37, 512), (130, 70, 256), (300, 65, 512)]
            };
            for &(m, n, k) in shapes {
                let (bk, bb) = (ty.block_k() as usize, ty.block_bytes() as usize);
                let w = random_blocks(ty, m * k / bk, &mut rng);
                let x = rng.symmetric_vec(n * k, 1.0);
                let mut xq = vec![0u8; n * k / 32 * 36];
                quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
                let nb = k / 32;
                let (wb, xb) = (up(ops, &w), up(ops, &xq));
                let mut outs = Vec::new();
                for variant in [MmqVariant::Wmma, MmqVariant::Dot4] {
                    let y = zeros(ops, n * m * 4);
                    ops.mmq(&S, ty, variant, wb.ptr, xb.ptr, y.ptr, m as u32, n as u32, k as u32, m as u32).unwrap();
                    outs.push(y.f32s());
                }
                let what = format!("mmq {ty:?} {m}x{n}x{k}");
                assert_bits(name, &format!("{what} dot4 vs wmma"), &outs[1], &outs[0]);
                let got = &outs[0];
                if ty == WType::Q8_0 {
                    // Per 32-block the exact integer dot, `acc = acc + dot as f32 * (d_w * d_x)`.
                    let want = q8_0_scalar_order(&w, &xq, m, n, k);
                    assert_bits(name, &format!("{what} vs scalar order"), got, &want);
                }
                let row_bytes = k / bk * bb;
                let mut a = vec![0f32; k];
                let mut wr = vec![0f32; k];
                let mut worst = 0f64;
                for r in 0..m {
                    quant::dequantize_row(ggml(ty), &w[r * row_bytes..(r + 1) * row_bytes], &mut wr).unwrap();
                    for c in 0..n {
                        quant::dequantize_row(GgmlType::Q8_1, &xq[c * nb * 36..(c + 1) * nb * 36], &mut a).unwrap();
                        let (dot, mag) = wr.iter().zip(&a).fold((0f64, 0f64), |(d, mg), (&p, &q)| (d + p as f64 * q as f64, mg + (p as f64 * q as f64).abs()));
                        let g = got[c * m + r] as f64;
                        let err = (g - dot).abs() / (mag + 1e-30);
                        worst = worst.max(err);
                        assert!(g.is_finite() && err <= mmq_tolerance(ty), "{name} {what} row {r} col {c}: gpu {g} ref {dot} (rel err {err:.2e})");
                    }
                }
                eprintln!("{name} {what}: worst rel err {worst:.2e} (tolerance {:.0e})", mmq_tolerance(ty));
            }
        }
        assert!(ops.mmq(&S, WType::Q4K, MmqVariant::Wmma, 0, 0, 0, 16, 16, 96, 16).is_err(), "k not a multiple of 256");
        assert!(ops.mmq(&S, WType::Q8_0, MmqVariant::Dot4, 0, 0, 0, 16, 16, 64, 8).is_err(), "y_stride < nrows");
    }
);

test_device!(
    /// Expert-dispatch MMVQ (`mmvq_moe_*`, the router's choice read on the device): for every
    /// type, 1..=8 tokens, k = 1..8 experts per token, shared and distinct experts, the plain, GLU
    /// and down (`x_div` = 1) forms equal `mmvq` / `mmvq_glu` of the chosen expert on that column
    /// bit for bit, and the CPU scalar reference (quant's dequantizers, f64 dot) within the MMVQ
    /// tolerance. A slot whose id is `MOE_SLOT_MISS` (an expert-cache miss) is skipped and its
    /// row left as it was; any other out-of-range expert id traps instead of reading past the
    /// stack.
    fn gpu_ops_mmvq_moe_matches_mmvq_and_cpu(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(17);
        for ty in WType::ALL {
            let bk = ty.block_k() as usize;
            // (tokens, k used, experts, rows, k)
            for (nt, ku, ne, nrows, kd) in [(1usize, 2usize, 4usize, 40usize, 256usize), (1, 8, 16, 64, 512), (3, 2, 3, 70, 256), (8, 8, 12, 33, 256), (5, 1, 2, 16, 768)] {
                let mat = nrows * kd / bk * ty.block_bytes() as usize;
                let row_bytes = kd / bk * ty.block_bytes() as usize;
                let wg = random_blocks(ty, ne * nrows * kd / bk, &mut rng);
                let wu = random_blocks(ty, ne * nrows * kd / bk, &mut rng);
                let ns = nt * ku;
                // Each token picks ku distinct experts (some shared between tokens).
                let ids = random_routing(&mut rng, nt, ku, ne);
                let x = rng.symmetric_vec(ns * kd, 1.0);
                let mut xq = vec![0u8; ns * kd / 32 * 36];
                quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
                let (gb, ub, xb, ib) = (up(ops, &wg), up(ops, &wu), up(ops, &xq), upu(ops, &ids));
                let colb = (kd / 32 * 36) as u64;
                let what = |f: &str| format!("{f} {ty:?} tokens={nt} k={ku} experts={ne} rows={nrows} k={kd}");
                for (form, x_div) in [("gate/up", ku), ("down", 1)] {
                    let y = zeros(ops, ns * nrows * 4);
                    let yf = zeros(ops, ns * nrows * 4);
                    ops.mmvq_moe(&S, ty, None, gb.ptr, mat as u64, ne as u32, xb.ptr, x_div as u32, ib.ptr, ns as u32, y.ptr, nrows as u32, kd as u32, nt as u32)
                        .unwrap_or_else(|e| panic!("{name} {}: {e}", what(form)));
                    let glu = Some((ub.ptr, GluAct::Silu));
                    ops.mmvq_moe(&S, ty, glu, gb.ptr, mat as u64, ne as u32, xb.ptr, x_div as u32, ib.ptr, ns as u32, yf.ptr, nrows as u32, kd as u32, nt as u32)
                        .unwrap_or_else(|e| panic!("{name} {} glu: {e}", what(form)));
                    // The same slots through the existing kernels, one launch per slot.
                    let (want, wantf) = (zeros(ops, ns * nrows * 4), zeros(ops, ns * nrows * 4));
                    for (s, &e) in ids.iter().enumerate() {
                        let e = e as u64;
                        let xc = xb.ptr + (s / x_div) as u64 * colb;
                        let yo = (s * nrows * 4) as u64;
                        ops.mmvq(&S, ty, 1, gb.ptr + e * mat as u64, xc, want.ptr + yo, None, nrows as u32, kd as u32, nrows as u32).unwrap();
                        ops.mmvq_glu(&S, ty, 1, gb.ptr + e * mat as u64, ub.ptr + e * mat as u64, xc, wantf.ptr + yo, None, nrows as u32, kd as u32, nrows as u32, GluAct::Silu)
                            .unwrap();
                    }
                    let yv = y.f32s();
                    assert_bits(name, &what(form), &yv, &want.f32s());
                    assert_bits(name, &format!("{} glu", what(form)), &yf.f32s(), &wantf.f32s());
                    // Expert-cache misses (every third slot): skipped, their rows untouched, the
                    // others' bits unchanged.
                    let miss: Vec<u32> = ids.iter().enumerate().map(|(s, &e)| if s % 3 == 1 { abi::MOE_SLOT_MISS } else { e }).collect();
                    let mb = upu(ops, &miss);
                    let ym = up(ops, &vec![0x55u8; ns * nrows * 4]);
                    ops.mmvq_moe(&S, ty, None, gb.ptr, mat as u64, ne as u32, xb.ptr, x_div as u32, mb.ptr, ns as u32, ym.ptr, nrows as u32, kd as u32, nt as u32)
                        .unwrap_or_else(|e| panic!("{name} {} misses: {e}", what(form)));
                    let sentinel = f32::from_le_bytes([0x55; 4]);
                    let want_m: Vec<f32> = yv.chunks(nrows).zip(&miss).flat_map(|(row, &e)| row.iter().map(move |&v| if e == abi::MOE_SLOT_MISS { sentinel } else { v })).collect();
                    assert_bits(name, &format!("{} with misses", what(form)), &ym.f32s(), &want_m);
                    // CPU scalar reference: dequantized expert rows against the Q8_1 column.
                    let mut a = vec![0f32; kd];
                    let mut wr = vec![0f32; kd];
                    for s in 0..ns {
                        let c = s / x_div;
                        quant::dequantize_row(GgmlType::Q8_1, &xq[c * kd / 32 * 36..(c + 1) * kd / 32 * 36], &mut a).unwrap();
                        for i in 0..nrows {
                            let off = ids[s] as usize * mat + i * row_bytes;
                            quant::dequantize_row(ggml(ty), &wg[off..off + row_bytes], &mut wr).unwrap();
                            let (dot, mag) = wr.iter().zip(&a).fold((0f64, 0f64), |(d, m), (&p, &q)| (d + p as f64 * q as f64, m + (p as f64 * q as f64).abs()));
                            let got = yv[s * nrows + i] as f64;
                            // Q4_K's min term uses Q8_1's f16 block sums `s` (the reference
                            // dequantizes the quants): over these 64 x 33 rows up to ~2e-4.
                            let tol = if ty == WType::Q4K { 1e-3 } else { 1e-6 };
                            assert!((got - dot).abs() <= tol * (mag + 1e-30), "{name} {}: slot {s} row {i}: {got} vs {dot}", what(form));
                        }
                    }
                }
            }
        }
        // Refused shapes, and a corrupt expert id: a trap, never a read past the stack.
        let ty = WType::Q8_0;
        let w = random_blocks(ty, 2 * 32 * 256 / 32, &mut rng);
        let mat = (32 * 256 / 32 * 34) as u64;
        let xq = vec![0u8; 2 * 256 / 32 * 36];
        let (wb, xb, y) = (up(ops, &w), up(ops, &xq), zeros(ops, 2 * 32 * 4));
        assert!(ops.mmvq_moe(&S, ty, None, wb.ptr, mat, 2, xb.ptr, 1, 0, 65, y.ptr, 32, 256, 8).is_err(), "65 slots");
        assert!(ops.mmvq_moe(&S, ty, None, wb.ptr, mat - 1, 2, xb.ptr, 1, 0, 2, y.ptr, 32, 256, 1).is_err(), "short expert stride");
        assert!(ops.mmvq_moe(&S, ty, None, wb.ptr, mat, 2, xb.ptr, 2, 0, 3, y.ptr, 32, 256, 1).is_err(), "x_div not dividing");
        if name == "emu" {
            let ib = upu(ops, &[1, 2]);
            let r = ops.mmvq_moe(&S, ty, None, wb.ptr, mat, 2, xb.ptr, 1, ib.ptr, 2, y.ptr, 32, 256, 1);
            let e = r.expect_err("expert id 2 of 2 must fail").to_string();
            assert!(e.contains("trap"), "{e}");
        }
    }
);
