//! `strata bench kernels`: every gfx11 kernel on the software device, with the numbers that
//! predict its speed on a real RX 7900 XTX: wave instructions executed (and per 256 weights),
//! global bytes moved against the ideal (each weight, activation and output byte once),
//! registers, LDS, and the waves per SIMD those allow. Every launch goes through [`GpuOps`]
//! over `GpuApi` (the engine's argument packing and grid math); the counters are the software
//! device's, read per launch with `GpuApi::take_stats`.
use emulator::{KernelInfo, LaunchStats};
use gpu_executor::abi::{self, WType};
use gpu_executor::device::{EmuApi, GpuApi, GpuError, Stream};
use gpu_executor::ops::{GpuOps, MmqVariant};
use gpu_executor::ops_host::ActQuant;
use gpu_executor::registry::{self, Family};
use std::fmt::Write;
use std::sync::Arc;

use rng::SplitMix64;

/// `nblocks` random blocks of `ty` (`synth::random_blocks`), block scales uniform in
/// 1e-3..1.1e-2: every bit pattern of the quants, realistic magnitudes.
pub fn random_blocks(ty: WType, nblocks: usize, rng: &mut SplitMix64) -> Vec<u8> {
    let ggml = quant::GgmlType::from_u32(ty.ggml_id()).expect("every WType is a ggml type");
    synth::random_blocks(ggml, nblocks, rng, |rng, _| 1e-3 + 1e-2 * (rng.symmetric() * 0.5 + 0.5))
        .expect("every WType has a recipe")
}

/// A routing choice: `k` distinct experts of `n_expert` for each of `n_tokens` tokens
/// (`[token][rank]`, a partial Fisher-Yates shuffle each), as `moe_router` leaves in `sel_ids`.
pub fn random_routing(rng: &mut SplitMix64, n_tokens: usize, k: usize, n_expert: usize) -> Vec<u32> {
    let mut ids = Vec::with_capacity(n_tokens * k);
    for _ in 0..n_tokens {
        let mut pick: Vec<u32> = (0..n_expert as u32).collect();
        for i in 0..k {
            let j = i + (rng.next_u64() as usize) % (n_expert - i);
            pick.swap(i, j);
        }
        ids.extend_from_slice(&pick[..k]);
    }
    ids
}

/// Waves per SIMD that registers and LDS allow on gfx1100 (wave32: 1536 VGPRs per SIMD,
/// allocated in granules of 24; 128 KiB LDS per WGP of 4 SIMDs; at most 16 waves).
pub fn waves_per_simd(vgprs: u32, lds_per_wg: u32, waves_per_wg: u32) -> u32 {
    let by_vgpr = 1536 / vgprs.max(1).next_multiple_of(24);
    let by_lds = 131072u32.checked_div(lds_per_wg).map_or(16, |wgs| wgs * waves_per_wg / 4);
    by_vgpr.min(by_lds).min(16)
}

#[allow(clippy::too_many_arguments)]
fn row(
    out: &mut String,
    name: &str,
    shape: &str,
    st: &LaunchStats,
    info: Option<&KernelInfo>,
    lds: u32,
    ideal: u64,
    weights: u64,
) {
    row_with(out, name, shape, st, info, lds, ideal, weights, "")
}

#[allow(clippy::too_many_arguments)]
fn row_with(
    out: &mut String,
    name: &str,
    shape: &str,
    st: &LaunchStats,
    info: Option<&KernelInfo>,
    lds: u32,
    ideal: u64,
    weights: u64,
    extra: &str,
) {
    let moved = st.global_bytes_read + st.global_bytes_written;
    let (v, s, static_lds) = info.map_or((0, 0, 0), |i| (i.vgpr_count, i.sgpr_count, i.group_segment_size));
    let lds = lds + static_lds;
    let per256 = if weights > 0 {
        format!("{:8.2}", st.instructions as f64 * 256.0 / weights as f64)
    } else {
        "       -".into()
    };
    let _ = writeln!(
        out,
        "{name:<24} {shape:<16} {:>12} {per256} {:>12} {:>12} {:>6.3} {v:>4} {s:>4} {lds:>6} {:>3}{extra}",
        st.instructions,
        moved,
        ideal,
        moved as f64 / ideal.max(1) as f64,
        waves_per_simd(v, lds, abi::WAVES_PER_WG),
    );
}

/// Runs every kernel on representative shapes (4096 x 4096 MMVQ for every weight type, 1 and
/// 8 columns, an MoE-style row selection) and returns a table. `quick` uses smaller shapes.
pub fn bench_kernels(quick: bool) -> String {
    let mut out = String::new();
    let ops = match EmuApi::new().and_then(|api| GpuOps::new(Arc::new(api))) {
        Ok(o) => o,
        Err(e) => return format!("cannot load the kernels on the software device: {e}\n"),
    };
    let info = |name: &str| ops.kernel(name).map(|k| &k.info);
    let _ = writeln!(
        out,
        "{:<24} {:<16} {:>12} {:>8} {:>12} {:>12} {:>6} {:>4} {:>4} {:>6} {:>3} {:>4}",
        "kernel",
        "shape",
        "wave-instrs",
        "i/256w",
        "bytes moved",
        "ideal bytes",
        "ratio",
        "vgpr",
        "sgpr",
        "lds",
        "w/s",
        "wgs"
    );
    let mut misses = Vec::new();
    let mut rng = SplitMix64::new(0x5eed);
    let (big, k) = if quick { (512usize, 1024usize) } else { (4096, 4096) };

    // Activation quantization.
    let x: Vec<f32> = (0..k * 8).map(|_| rng.symmetric()).collect();
    for (kind, name, bytes, qk) in [
        (ActQuant::Q8_1, abi::QUANTIZE_Q8_1, abi::Q8_1_BYTES, abi::QK8_1),
        (ActQuant::Q8K, abi::QUANTIZE_Q8_K, abi::Q8_K_BYTES, abi::QK_K),
    ] {
        match ops.host_quantize(kind, &x) {
            Ok((_, st)) => {
                let ideal = (x.len() * 4 + x.len() / qk as usize * bytes as usize) as u64;
                row(&mut out, name, &format!("{}", x.len()), &st.unwrap_or_default(), info(name), 0, ideal, 0)
            }
            Err(e) => {
                let _ = writeln!(out, "{name}: {e}");
            }
        }
    }

    for ty in WType::ALL {
        let row_bytes = k / ty.block_k() as usize * ty.block_bytes() as usize;
        let w = random_blocks(ty, big * k / ty.block_k() as usize, &mut rng);
        for ncols in MMVQ_BENCH_COLS {
            let name = abi::mmvq_kernel(ty, ncols as u32).unwrap_or("?");
            let lds = abi::mmvq_lds_bytes(ty, k as u32, ncols as u32);
            match mmvq_bytes(&ops, ty, &w, k, ncols, &mut rng) {
                Ok(m) => {
                    let flag = if m.ratio() <= MMVQ_BYTES_TARGET {
                        "ok".to_string()
                    } else {
                        format!("MISS (> {MMVQ_BYTES_TARGET:.2}x)")
                    };
                    let extra = format!(" {:>4} {flag}", m.workgroups);
                    row_with(
                        &mut out,
                        name,
                        &format!("{big}x{k}"),
                        &m.stats,
                        info(name),
                        lds,
                        m.ideal,
                        (big * k * ncols) as u64,
                        &extra,
                    );
                    if m.ratio() > MMVQ_BYTES_TARGET {
                        misses.push(format!("{name} {big}x{k}: {:.3}x", m.ratio()));
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "{name} {big}x{k}: {e}");
                }
            }
        }
        // MoE-style: 8 of 64 "experts" of 64 rows, one column.
        let experts: Vec<u32> = (0..8u32).flat_map(|e| (0..64u32).map(move |r| ((e * 7 + 3) % 64) * 64 + r)).collect();
        let wsel = &w[..(4096.min(big) / 64 * 64) * row_bytes];
        let experts: Vec<u32> = experts.into_iter().filter(|&r| (r as usize) < wsel.len() / row_bytes).collect();
        let xs: Vec<f32> = (0..k).map(|_| rng.symmetric()).collect();
        let mut xq = vec![0u8; k / 32 * 36];
        if quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq).is_ok() && !experts.is_empty() {
            let name = abi::mmvq_kernel(ty, 1).unwrap_or("?");
            if let Ok((_, st)) = ops.host_mmvq(ty, wsel, k, &xq, 1, Some(&experts)) {
                let n = experts.len();
                let ideal = (n * row_bytes + xq.len() + n * 4 + n * 4) as u64;
                let lds = abi::mmvq_lds_bytes(ty, k as u32, 1);
                row(
                    &mut out,
                    name,
                    &format!("rows[{n}]x{k}"),
                    &st.unwrap_or_default(),
                    info(name),
                    lds,
                    ideal,
                    (n * k) as u64,
                );
            }
        }
        // Dequantization of 256 rows.
        let nrows = if quick { 64 } else { 256 };
        let wd = &w[..nrows * row_bytes];
        for f16 in [false, true] {
            let name = abi::dequant_kernel(ty, f16).unwrap_or("?");
            let r = if f16 {
                ops.host_dequant_f16(ty, wd).map(|(_, s)| s)
            } else {
                ops.host_dequant_f32(ty, wd).map(|(_, s)| s)
            };
            match r {
                Ok(st) => {
                    let ideal = (wd.len() + nrows * k * if f16 { 2 } else { 4 }) as u64;
                    let lds = abi::dequant_lds_bytes(ty);
                    row(
                        &mut out,
                        name,
                        &format!("{nrows}x{k}"),
                        &st.unwrap_or_default(),
                        info(name),
                        lds,
                        ideal,
                        (nrows * k) as u64,
                    )
                }
                Err(e) => {
                    let _ = writeln!(out, "{name}: {e}");
                }
            }
        }
    }
    out.push_str(&bench_ops(quick));
    let _ = writeln!(
        out,
        "wave-instrs = wave instructions executed; i/256w = per 256 weights (and column); ratio = bytes moved / ideal \
         (weights + activations + outputs once); w/s = waves per SIMD allowed by VGPRs and LDS (gfx1100); \
         wgs = MMVQ workgroups (abi::mmvq_rows_per_wg), flag = MMVQ ratio against the {MMVQ_BYTES_TARGET:.2}x target"
    );
    if !quick {
        if misses.is_empty() {
            let _ = writeln!(
                out,
                "MMVQ bytes: every type and column count within {MMVQ_BYTES_TARGET:.2}x of ideal on {big}x{k}"
            );
        } else {
            let _ = writeln!(
                out,
                "MMVQ bytes: {} MISS the {MMVQ_BYTES_TARGET:.2}x target: {}",
                misses.len(),
                misses.join(", ")
            );
        }
    }
    out += &reduction_table(&ops);
    out += &registry_coverage(&out, &ops.api().info().arch);
    out
}

/// Which registry kernels of `arch` have a row in `table` (rows start with the kernel name;
/// the reduction table covers every `Family::Reduce` kernel), by family.
fn registry_coverage(table: &str, arch: &str) -> String {
    let benched: std::collections::BTreeSet<&str> = table.lines().filter_map(|l| l.split_whitespace().next()).collect();
    let (mut with_row, mut total) = (0, 0);
    let mut without: std::collections::BTreeMap<String, usize> = Default::default();
    for e in registry::for_arch(arch) {
        total += 1;
        if benched.contains(e.name) || e.family == Family::Reduce {
            with_row += 1;
        } else {
            *without.entry(format!("{:?}", e.family)).or_default() += 1;
        }
    }
    let rest: Vec<String> = without.iter().map(|(f, n)| format!("{f} {n}")).collect();
    format!(
        "kernel registry ({arch}): {with_row} of {total} kernels measured above; the others by family: {}\n",
        rest.join(", ")
    )
}

/// Column counts `strata bench kernels` (and the byte test) run MMVQ with.
pub const MMVQ_BENCH_COLS: [usize; 4] = [1, 2, 4, 8];
/// Issue 2's target: an MMVQ launch on a 4096 x 4096 matrix moves at most this many times the
/// ideal global bytes (weights + activations + outputs, each once).
pub const MMVQ_BYTES_TARGET: f64 = 1.10;

/// Global bytes of one MMVQ launch (default geometry) against the ideal.
pub struct MmvqBytes {
    pub stats: LaunchStats,
    pub moved: u64,
    pub ideal: u64,
    pub workgroups: u32,
    pub rows_per_wg: u32,
}
impl MmvqBytes {
    pub fn ratio(&self) -> f64 {
        self.moved as f64 / self.ideal.max(1) as f64
    }
}

/// Runs MMVQ of weights `w` (`k` per row, whole rows) with `ncols` random activation columns and
/// the default geometry (`abi::mmvq_rows_per_wg`) on `ops`, which must be the software device
/// (its byte counters); returns the counted global bytes and the ideal (weights + Q8_1
/// activations + f32 outputs, each once). Counted bytes do not depend on the data.
pub fn mmvq_bytes(
    ops: &GpuOps,
    ty: WType,
    w: &[u8],
    k: usize,
    ncols: usize,
    rng: &mut SplitMix64,
) -> Result<MmvqBytes, GpuError> {
    let row_bytes = k / ty.block_k() as usize * ty.block_bytes() as usize;
    let nrows = w.len() / row_bytes.max(1);
    let xs: Vec<f32> = (0..k * ncols).map(|_| rng.symmetric()).collect();
    let mut xq = vec![0u8; ncols * k / 32 * abi::Q8_1_BYTES as usize];
    quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq)
        .map_err(|e| GpuError::Launch { kernel: "quantize_q8_1 (host reference)".into(), what: format!("{e:?}") })?;
    let (_, stats) = ops.host_mmvq(ty, w, k, &xq, ncols, None)?;
    let stats = stats.ok_or_else(|| no_counters(ops))?;
    let rows_per_wg = abi::mmvq_rows_per_wg(ty, k as u32, nrows as u32, ncols as u32);
    Ok(MmvqBytes {
        moved: stats.global_bytes_read + stats.global_bytes_written,
        ideal: (w.len() + xq.len() + ncols * nrows * 4) as u64,
        workgroups: (nrows as u32).div_ceil(rows_per_wg),
        rows_per_wg,
        stats,
    })
}

// ---------------------------------------------------------------- cross-lane reductions

/// What the RDNA3 ISA guide and the emitted code say about each method's cost class.
fn reduce_method(m: u32) -> (&'static str, &'static str) {
    match m {
        0 => ("none (baseline: * 1/32 + loop)", "absolute marginal cost of the loop body without a sum"),
        1 => (
            "DPP row_xmask + permlanex16",
            "VALU only: DPP is a source modifier folded into v_add_f32_dpp; permlanex16 = 1 VALU + v_mov (tied old) + add; no LDS, no waits",
        ),
        2 => (
            "DPP row_xmask + readlane x2",
            "VALU + 2 v_readlane_b32 (VALU -> SGPR) + an add of two SGPRs; result wave-uniform",
        ),
        3 => (
            "permlane16 + permlanex16",
            "VALU only, nothing folds: permlane + v_mov (tied old) + add per step, lane selects in SGPRs",
        ),
        4 => ("ds_swizzle (xor)", "LDS unit (no memory): every step issues to the DS pipe and waits s_waitcnt lgkmcnt"),
        5 => (
            "ds_bpermute (lane^m)*4",
            "LDS unit (no memory) with a per-lane address (xor + shift VALU): waits lgkmcnt per step",
        ),
        _ => ("?", ""),
    }
}

/// One reduction benchmark's measurement: the marginal dynamic cost of one 32-lane sum (launch
/// with `reps` = 9 minus `reps` = 1, per sum, minus the same marginal of the baseline kernel,
/// whose loop does only the `* 1/32`), static counts of the instructions that matter in its
/// listing, and whether its sums equal the CPU butterfly bit for bit.
pub struct ReduceMeasure {
    pub method: u32,
    pub values: u32,
    pub name: &'static str,
    pub instrs_per_sum: f64,
    pub valu_per_sum: f64,
    pub ds_per_sum: f64,
    /// SOPP: `s_waitcnt`, `s_delay_alu`, `s_nop`, branches.
    pub sopp_per_sum: f64,
    /// Other scalar instructions (SOP1/SOP2/SOPK/SOPC/SMEM).
    pub salu_per_sum: f64,
    pub static_waitcnt: usize,
    pub static_dpp: usize,
    pub static_permlane: usize,
    pub static_readlane: usize,
    pub static_ds: usize,
    /// Sums that differ from the CPU reference (bits), over both launches.
    pub mismatches: usize,
}

/// The xor butterfly every variant computes (lane ^ 1, 2, 4, 8, 16, in that order), in place:
/// every lane ends with the same bits (each step adds a commutative pair).
pub fn butterfly(x: &mut [f32; 32]) {
    for m in [1usize, 2, 4, 8, 16] {
        let prev = *x;
        for (l, xl) in x.iter_mut().enumerate() {
            *xl = prev[l] + prev[l ^ m];
        }
    }
}

/// The lines of kernel `name` in a disassembly listing (objdump syntax).
pub fn kernel_listing<'a>(dis: &'a str, name: &str) -> Option<&'a str> {
    let head = format!("<{name}>:");
    let start = dis.find(&head)?;
    let rest = &dis[start + head.len()..];
    let end = rest.find(">:\n").and_then(|e| rest[..e].rfind('\n')).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Per-family counters of one launch, as f64.
fn fam(s: &LaunchStats, f: &[&str]) -> f64 {
    f.iter().map(|k| s.by_family.get(*k).copied().unwrap_or(0)).sum::<u64>() as f64
}
const VALU: &[&str] = &["valu", "vop3p", "vopd"];
const SALU: &[&str] = &["sop1", "sop2", "sopk", "sopc", "smem"];

/// The error of a measurement that needs the software device's counters on another device.
fn no_counters(ops: &GpuOps) -> GpuError {
    let info = ops.api().info();
    GpuError::InvalidArgument {
        call: "take_stats",
        why: format!("{} counts no instructions or bytes (use the software device)", info.name),
    }
}

/// Runs every `reduce_*` benchmark kernel of the code object on `ops` (the software device:
/// its instruction counters per launch) and reads their listings from the same object.
pub fn measure_reductions(ops: &GpuOps) -> Result<Vec<ReduceMeasure>, String> {
    let api = ops.api();
    let arch = gpu_executor::device::arch_base(&api.info().arch).to_string();
    let co = gpu_executor::code_object_for(&arch).ok_or_else(|| format!("no {arch} code object"))?;
    let dis = emulator::disassemble(co).map_err(|e| e.to_string())?;
    let s = Stream::DEFAULT;
    let n_waves = 64u32;
    let (r_lo, r_hi) = (1u32, 9u32);
    let mut rng = SplitMix64::new(0x7ed);
    // Marginal per-sum counters [instrs, valu, ds, sopp, salu] of the baseline, by V.
    let mut base: std::collections::HashMap<u32, [f64; 5]> = Default::default();
    let mut res = Vec::new();
    // The baselines (method 0) come first in abi::REDUCE_KERNELS.
    for &(m, v, name) in abi::REDUCE_KERNELS {
        let nsum = (n_waves * v) as usize;
        let x: Vec<f32> = (0..nsum * 32).map(|_| rng.symmetric() * 100.0).collect();
        let xb: Vec<u8> = x.iter().flat_map(|f| f.to_le_bytes()).collect();
        let xp = api.malloc(xb.len()).map_err(|e| e.to_string())?;
        let yp = api.malloc(nsum * 4).map_err(|e| e.to_string())?;
        api.memcpy_htod(xp, &xb).map_err(|e| e.to_string())?;
        let mut stats = Vec::new();
        let mut mismatches = 0;
        for reps in [r_lo, r_hi] {
            let _ = api.take_stats();
            ops.reduce_bench(&s, name, xp, yp, n_waves, reps).map_err(|e| e.to_string())?;
            api.synchronize().map_err(|e| e.to_string())?;
            let st = api.take_stats().ok_or_else(|| no_counters(ops).to_string())?;
            let mut yb = vec![0u8; nsum * 4];
            api.memcpy_dtoh(&mut yb, yp).map_err(|e| e.to_string())?;
            for i in 0..nsum {
                let mut lanes: [f32; 32] = x[i * 32..i * 32 + 32].try_into().expect("32 lanes");
                for _ in 0..reps {
                    if m != 0 {
                        butterfly(&mut lanes);
                    }
                    lanes = lanes.map(|l| l * (1.0 / 32.0));
                }
                let got = f32::from_le_bytes([yb[4 * i], yb[4 * i + 1], yb[4 * i + 2], yb[4 * i + 3]]);
                mismatches += usize::from(got.to_bits() != lanes[0].to_bits());
            }
            stats.push(st);
        }
        let _ = api.free(xp);
        let _ = api.free(yp);
        let per = ((r_hi - r_lo) as usize * nsum) as f64;
        let d = |g: &dyn Fn(&LaunchStats) -> f64| (g(&stats[1]) - g(&stats[0])) / per;
        let marg = [
            d(&|s| s.instructions as f64),
            d(&|s| fam(s, VALU)),
            d(&|s| fam(s, &["ds"])),
            d(&|s| fam(s, &["sopp"])),
            d(&|s| fam(s, SALU)),
        ];
        let b = *base.entry(v).or_insert(marg);
        let c: Vec<f64> = (0..5).map(|i| if m == 0 { marg[i] } else { marg[i] - b[i] }).collect();
        let text = kernel_listing(&dis, name).unwrap_or("");
        let count = |pat: &str| text.lines().filter(|l| l.contains(pat)).count();
        res.push(ReduceMeasure {
            method: m,
            values: v,
            name,
            instrs_per_sum: c[0],
            valu_per_sum: c[1],
            ds_per_sum: c[2],
            sopp_per_sum: c[3],
            salu_per_sum: c[4],
            static_waitcnt: count("s_waitcnt"),
            static_dpp: count("_dpp "),
            static_permlane: count("v_permlane"),
            static_readlane: count("v_readlane"),
            static_ds: count("ds_swizzle") + count("ds_bpermute"),
            mismatches,
        });
    }
    Ok(res)
}

/// The reduction comparison printed by `strata bench kernels`.
fn reduction_table(ops: &GpuOps) -> String {
    let mut out = String::from(
        "\ncross-lane 32-lane f32 sum (wave32): wave instructions per sum, marginal (reps 9 - reps 1) minus the baseline; \
         v1 = one sum in flight per wave, v8 = 8 independent sums (as MMVQ with 8 columns):\n",
    );
    let rows = match measure_reductions(ops) {
        Ok(r) => r,
        Err(e) => return out + &format!("reduction benchmarks failed: {e}\n"),
    };
    let _ = writeln!(
        out,
        "{:<28} {:>2} {:>6} {:>5} {:>4} {:>5} {:>5} | listing: {:>4} {:>3} {:>4} {:>4} {:>3} | {:<5} cost class",
        "method", "v", "instrs", "valu", "ds", "sopp", "salu", "wait", "dpp", "perm", "rdln", "ds", "exact"
    );
    for r in &rows {
        let (label, class) = reduce_method(r.method);
        let _ = writeln!(
            out,
            "{label:<28} {:>2} {:>6.2} {:>5.2} {:>4.2} {:>5.2} {:>5.2} |          {:>4} {:>3} {:>4} {:>4} {:>3} | {:<5} {class}",
            r.values,
            r.instrs_per_sum,
            r.valu_per_sum,
            r.ds_per_sum,
            r.sopp_per_sum,
            r.salu_per_sum,
            r.static_waitcnt,
            r.static_dpp,
            r.static_permlane,
            r.static_readlane,
            r.static_ds,
            if r.mismatches == 0 { "yes" } else { "NO" },
        );
    }
    out += "chosen: DPP row_xmask + permlanex16 (fewest instructions, all VALU, no LDS round trips or waits; every lane gets the sum)\n";
    out
}

/// The forward-pass ops of [`gpu_executor::ops::GpuOps`] on the software device through `GpuApi`
/// (decode shapes of a 4096-wide, 32-head / 8-KV-head, head_dim 128 model): one table row per
/// launch, same columns as [`bench_kernels`] (i/256w is blank; bytes are global bytes against
/// the ideal: every input and output byte once, K/V rows once per KV head).
pub fn bench_ops(quick: bool) -> String {
    use gpu_executor::ops::{AttnMode, GluAct, KvFormat, RowType};
    let mut out = String::new();
    let api: Arc<dyn GpuApi> = match EmuApi::new() {
        Ok(a) => Arc::new(a),
        Err(e) => return format!("cannot open the software device: {e}\n"),
    };
    let ops = match GpuOps::new(api.clone()) {
        Ok(o) => o,
        Err(e) => return format!("cannot load the kernels: {e}\n"),
    };
    let s = Stream::DEFAULT;
    let mut rng = SplitMix64::new(0x0b5);
    let mut bufs = Vec::new();
    let mut alloc = |bytes: &[u8]| -> u64 {
        let p = api.malloc(bytes.len().max(16)).unwrap_or(0);
        if p != 0 {
            let _ = api.memcpy_htod(p, bytes);
            bufs.push(p);
        }
        p
    };
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let u32b = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (d, nh, nkv, hd, ff) = (4096usize, 32usize, 8usize, 128usize, 14336usize);
    let kv_len = if quick { 256usize } else { 2048 };
    let mut rnd = |n: usize, sc: f32| -> Vec<f32> { (0..n).map(|_| rng.symmetric() * sc).collect() };
    let x8 = rnd(8 * d, 2.0);
    let wn = rnd(d, 1.0);
    let gate = rnd(ff, 4.0);
    let upv = rnd(ff, 1.0);
    let q = rnd(8 * nh * hd, 1.0);
    let kvrow = rnd(8 * nkv * hd, 1.0);
    let logits = rnd(8 * 128, 3.0);
    let emb = random_blocks(WType::Q4K, 1000 * d / 256, &mut SplitMix64::new(7));
    let ids8: Vec<u32> = (0..8).map(|i| i * 97 % 1000).collect();
    let pos8: Vec<u32> = (0..8).map(|i| (kv_len - 8 + i) as u32).collect();
    let table = GpuOps::rope_table(10000.0, 1.0, hd, kv_len);
    let (xp, wp, yp) = (alloc(&f32b(&x8)), alloc(&f32b(&wn)), alloc(&vec![0u8; 8 * d * 4]));
    let (gp, upp, op) = (alloc(&f32b(&gate)), alloc(&f32b(&upv)), alloc(&vec![0u8; ff * 4]));
    let (qp, kvp, qout) = (alloc(&f32b(&q)), alloc(&f32b(&kvrow)), alloc(&vec![0u8; 8 * nh * hd * 4]));
    let (posp, tabp) = (alloc(&u32b(&pos8)), alloc(&f32b(&table)));
    let kcache: Vec<u8> =
        (0..kv_len * nkv * hd).flat_map(|_| quant::f32_to_f16(rnd(1, 1.0)[0]).to_le_bytes()).collect();
    let kc = alloc(&kcache);
    let vc = alloc(&kcache);
    let k8: Vec<u8> = (0..kv_len * nkv * hd).map(|i| (i * 37 % 255) as u8).collect();
    let scales = f32b(&vec![0.01f32; kv_len * nkv]);
    let (k8p, v8p, ks, vs) = (alloc(&k8), alloc(&k8), alloc(&scales), alloc(&scales));
    let (embp, idp, embout) = (alloc(&emb), alloc(&u32b(&ids8)), alloc(&vec![0u8; 8 * d * 4]));
    let (lp, rid, rw) = (alloc(&f32b(&logits)), alloc(&vec![0u8; 8 * 8 * 4]), alloc(&vec![0u8; 8 * 8 * 4]));
    let ymoe = alloc(&f32b(&rnd(64 * d, 1.0)));
    let map: Vec<u32> = (0..64).collect();
    let (mapp, mwp) = (alloc(&u32b(&map)), alloc(&f32b(&vec![0.125f32; 64])));
    let _ = api.take_stats();
    let run = |out: &mut String,
               name: &str,
               shape: String,
               ideal: usize,
               lds: u32,
               waves: u32,
               r: gpu_executor::device::Result<()>| {
        let st = api.take_stats().unwrap_or_default();
        if let Err(e) = r {
            let _ = writeln!(out, "{name} {shape}: {e}");
            return;
        }
        let info = ops.kernel(name).map(|k| k.info.clone());
        let moved = st.global_bytes_read + st.global_bytes_written;
        let (v, sg, static_lds) =
            info.as_ref().map_or((0, 0, 0), |i| (i.vgpr_count, i.sgpr_count, i.group_segment_size));
        let _ = writeln!(
            out,
            "{name:<24} {shape:<16} {:>12}        - {:>12} {:>12} {:>6.3} {v:>4} {sg:>4} {:>6} {:>3}",
            st.instructions,
            moved,
            ideal,
            moved as f64 / ideal.max(1) as f64,
            lds + static_lds,
            waves_per_simd(v, lds + static_lds, waves),
        );
    };
    let w8 = abi::WAVES_PER_WG;
    for rows in [1usize, 8] {
        let r = ops.rms_norm(&s, xp, wp, yp, d as u32, rows as u32, 1e-6);
        run(&mut out, abi::RMS_NORM, format!("{rows}x{d}"), rows * d * 8 + d * 4, 0, w8, r);
    }
    let r = ops.rms_norm_ggml(&s, xp, wp, yp, d as u32, 1, 1e-6);
    run(&mut out, abi::RMS_NORM, format!("ggml 1x{d}"), d * 12, 0, w8, r);
    for nt in [1usize, 8] {
        let r = ops.rope(&s, qp, posp, tabp, nt as u32, nh as u32, hd as u32, hd as u32, true, false);
        run(&mut out, abi::ROPE, format!("{nt}x{nh}x{hd}"), nt * nh * hd * 8 + nt * hd * 4 + nt * 4, 0, w8, r);
    }
    let r = ops.glu(&s, gp, upp, op, ff as u32, GluAct::Silu);
    run(&mut out, abi::GLU, format!("silu {ff}"), ff * 12, 0, w8, r);
    let r = ops.glu(&s, gp, upp, op, ff as u32, GluAct::GeluTanh);
    run(&mut out, abi::GLU, format!("gelu {ff}"), ff * 12, 0, w8, r);
    let r = ops.add_rows(&s, yp, xp, d as u32, 8, d as u32);
    run(&mut out, abi::ADD_ROWS, format!("8x{d}"), 8 * d * 12, 0, w8, r);
    let r = ops.scale(&s, yp, (8 * d) as u32, 0.5);
    run(&mut out, abi::SCALE, format!("{}", 8 * d), 8 * d * 8, 0, w8, r);
    let r = ops.softmax(&s, yp, d as u32, 8);
    run(&mut out, abi::SOFTMAX, format!("8x{d}"), 8 * d * 8, 0, w8, r);
    let r = ops.get_rows(&s, RowType::W(WType::Q4K), embp, idp, 8, d as u32, embout, 1.0);
    let name = abi::get_rows_kernel(WType::Q4K).unwrap_or("?");
    run(&mut out, name, format!("8x{d} q4_K"), 8 * (d / 256 * 144 + d * 4 + 4), 0, w8, r);
    for (fmt, name, cache, sc, esz) in
        [(KvFormat::F16, abi::KV_STORE_F16, kc, 0, 2usize), (KvFormat::Int8, abi::KV_STORE_I8, k8p, ks, 1)]
    {
        let r = ops.kv_store(&s, fmt, kvp, cache, sc, posp, 8, nkv as u32, hd as u32);
        let ideal = 8 * nkv * hd * (4 + esz) + 8 * 4 + if esz == 1 { 8 * nkv * 4 } else { 0 };
        run(&mut out, name, format!("8x{nkv}x{hd}"), ideal, 0, w8, r);
    }
    for (fmt, k, v, ksp, vsp, esz) in [(KvFormat::F16, kc, vc, 0, 0, 2usize), (KvFormat::Int8, k8p, v8p, ks, vs, 1)] {
        for nt in [1usize, 8] {
            let r = ops.attention(
                &s,
                AttnMode::Ordered,
                fmt,
                qp,
                k,
                ksp,
                v,
                vsp,
                qout,
                posp,
                nt as u32,
                nh as u32,
                nkv as u32,
                hd as u32,
                0,
                0.088,
            );
            let name = abi::attn_kernel(fmt == KvFormat::Int8, hd as u32).unwrap_or("?");
            let ideal = 2 * nt * nh * hd * 4
                + 2 * kv_len * nkv * hd * esz
                + if esz == 1 { 2 * kv_len * nkv * 4 } else { 0 }
                + nt * 4;
            let lds = abi::attn_lds_bytes(hd as u32, ops.attn_max_kv());
            run(&mut out, name, format!("{nt}x{nh}/{nkv} kv{kv_len}"), ideal, lds, 1, r);
            let r = ops.attention(
                &s,
                AttnMode::Fast,
                fmt,
                qp,
                k,
                ksp,
                v,
                vsp,
                qout,
                posp,
                nt as u32,
                nh as u32,
                nkv as u32,
                hd as u32,
                0,
                0.088,
            );
            let name = abi::attn_fast_kernel(fmt == KvFormat::Int8, hd as u32).unwrap_or("?");
            let lds = abi::attn_fast_lds_bytes(hd as u32);
            run(&mut out, name, format!("{nt}x{nh}/{nkv} kv{kv_len}"), ideal, lds, abi::ATTN_FAST_WAVES, r);
        }
    }
    let r = ops.moe_router(&s, lp, rid, rw, 8, 128, 8, true);
    run(&mut out, abi::MOE_ROUTER, "8x128 k8".into(), 8 * 128 * 4 + 8 * 8 * 8, 0, w8, r);
    let r = ops.moe_combine(&s, ymoe, mapp, mwp, yp, d as u32, 8, 8);
    run(&mut out, abi::MOE_COMBINE, format!("8x8x{d}"), 64 * d * 4 + 8 * d * 4 + 64 * 8, 0, w8, r);
    // Fused gate/up MMVQ + SiLU, one column (i/256w counts both matrices' weights).
    let (nr, kk) = if quick { (512usize, 1024usize) } else { (4096, 4096) };
    let xs: Vec<f32> = (0..kk).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut xq = vec![0u8; kk / 32 * 36];
    if quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq).is_ok() {
        for ty in WType::ALL {
            let nblk = nr * kk / ty.block_k() as usize;
            let wg = random_blocks(ty, nblk, &mut SplitMix64::new(21));
            let wu = random_blocks(ty, nblk, &mut SplitMix64::new(22));
            let (gp, up, xp, yp) = (alloc(&wg), alloc(&wu), alloc(&xq), alloc(&vec![0u8; nr * 4]));
            let _ = api.take_stats();
            let r = ops.mmvq_glu(&s, ty, 1, gp, up, xp, yp, None, nr as u32, kk as u32, nr as u32, GluAct::Silu);
            let st = api.take_stats().unwrap_or_default();
            let name = abi::mmvq_glu_kernel(ty, 1).unwrap_or("?");
            match r {
                Ok(()) => {
                    let info = ops.kernel(name).map(|k| k.info.clone());
                    let lds = abi::mmvq_lds_bytes(ty, kk as u32, 1);
                    row(
                        &mut out,
                        name,
                        &format!("2x{nr}x{kk}"),
                        &st,
                        info.as_ref(),
                        lds,
                        (2 * wg.len() + xq.len() + nr * 4) as u64,
                        (2 * nr * kk) as u64,
                    );
                }
                Err(e) => {
                    let _ = writeln!(out, "{name}: {e}");
                }
            }
        }
    }
    // Expert dispatch (`mmvq_moe_*`, the router's choice read on the device): a
    // Qwen3-30B-A3B-shaped layer (d 2048, expert ff 768, 8 experts per token) over a stack of
    // 32 experts; fused gate/up + SiLU and down, 1 token (8 slots) and 8 tokens (64 slots, the
    // experts shared between tokens computed together). Ideal = every chosen expert's matrices
    // once + the activation columns + the outputs + the ids.
    let (md, mff, mne, mk) = if quick { (512usize, 256usize, 16usize, 8usize) } else { (2048, 768, 32, 8) };
    for ty in WType::ALL {
        let mat_blocks = mff * md / ty.block_k() as usize;
        let mat = mat_blocks * ty.block_bytes() as usize;
        let wg = random_blocks(ty, mne * mat_blocks, &mut SplitMix64::new(31));
        let wu = random_blocks(ty, mne * mat_blocks, &mut SplitMix64::new(32));
        let wd = random_blocks(ty, mne * mat_blocks, &mut SplitMix64::new(33));
        let (gp, upp, dp) = (alloc(&wg), alloc(&wu), alloc(&wd));
        for nt in [1usize, 8] {
            let ns = nt * mk;
            let ids = random_routing(&mut SplitMix64::new(34 + nt as u64), nt, mk, mne);
            let mut distinct = ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let xs: Vec<f32> = (0..ns * mff.max(md)).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
            let (mut xq, mut aq) = (vec![0u8; nt * md / 32 * 36], vec![0u8; ns * mff / 32 * 36]);
            if quant::quantize_row(quant::GgmlType::Q8_1, &xs[..nt * md], &mut xq).is_err()
                || quant::quantize_row(quant::GgmlType::Q8_1, &xs[..ns * mff], &mut aq).is_err()
            {
                continue;
            }
            let (idp, xp, ap) = (alloc(&u32b(&ids)), alloc(&xq), alloc(&aq));
            // (yp has room for a second output: the host-path rows use it as a temporary.)
            let (yp, dyp) = (alloc(&vec![0u8; 2 * ns * mff * 4]), alloc(&vec![0u8; ns * md.max(mff) * 4]));
            let ne = distinct.len();
            for (glu, w, k, nrows, xin, xlen, y, x_div) in
                [(true, gp, md, mff, xp, xq.len(), yp, mk), (false, dp, mff, md, ap, aq.len(), dyp, 1)]
            {
                let _ = api.take_stats();
                let g = glu.then_some((upp, GluAct::Silu));
                let r = ops.mmvq_moe(
                    &s,
                    ty,
                    g,
                    w,
                    mat as u64,
                    mne as u32,
                    xin,
                    x_div as u32,
                    idp,
                    ns as u32,
                    y,
                    nrows as u32,
                    k as u32,
                    nt as u32,
                );
                let st = api.take_stats().unwrap_or_default();
                let group = if nt == 1 { 1 } else { abi::mmvq_moe_max_group(ty, glu) };
                let name = abi::mmvq_moe_kernel(ty, glu, group).unwrap_or("?");
                let nmat = if glu { 2 } else { 1 };
                let shape = format!("{}{nt}t {ne}e {nrows}x{k}", if glu { "2x" } else { "" });
                match r {
                    Ok(()) => {
                        let info = ops.kernel(name).map(|k| k.info.clone());
                        let lds = abi::mmvq_moe_lds_bytes(ty, k as u32, group);
                        let ideal = (nmat * ne * mat + xlen + ns * nrows * 4 + ns * 4) as u64;
                        row(&mut out, name, &shape, &st, info.as_ref(), lds, ideal, (nmat * ne * nrows * k) as u64);
                    }
                    Err(e) => {
                        let _ = writeln!(out, "{name} {shape}: {e}");
                    }
                }
                if nt == 1 {
                    // The host-readback path's launches for the same slots (one token: one
                    // column per expert): mmvq per expert (gate, up, then glu; or down).
                    let _ = api.take_stats();
                    let colb = (k / 32 * 36) as u64;
                    let mut res = Ok(());
                    for (sl, &e) in ids.iter().enumerate() {
                        let xc = xin + (sl / x_div) as u64 * colb;
                        let yo = y + (sl * nrows * 4) as u64;
                        let we = w + e as u64 * mat as u64;
                        res = res
                            .and_then(|_| ops.mmvq(&s, ty, 1, we, xc, yo, None, nrows as u32, k as u32, nrows as u32));
                        if glu {
                            let (tg, tu) = (yp + (ns * nrows * 4) as u64, dyp);
                            let ue = upp + e as u64 * mat as u64;
                            res = res
                                .and_then(|_| {
                                    ops.mmvq(&s, ty, 1, ue, xc, tg, None, nrows as u32, k as u32, nrows as u32)
                                })
                                .and_then(|_| ops.glu(&s, yo, tg, tu, nrows as u32, GluAct::Silu));
                        }
                    }
                    let st = api.take_stats().unwrap_or_default();
                    let name = abi::mmvq_kernel(ty, 1).unwrap_or("?");
                    let ideal = (nmat * ne * mat + xlen + ns * nrows * 4) as u64;
                    let label = format!("host: {}{}", name, if glu { "+glu" } else { "" });
                    match res {
                        Ok(()) => row(&mut out, &label, &shape, &st, None, 0, ideal, (nmat * ne * nrows * k) as u64),
                        Err(e) => {
                            let _ = writeln!(out, "{label} {shape}: {e}");
                        }
                    }
                }
            }
        }
    }
    // MMQ prefill: every type and variant, weights x 64 Q8_1 token columns (one column tile).
    let ntok = 64usize;
    let xs: Vec<f32> = (0..ntok * kk).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut xq = vec![0u8; ntok * kk / 32 * 36];
    if quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq).is_ok() {
        for ty in WType::ALL {
            let w = random_blocks(ty, nr * kk / ty.block_k() as usize, &mut SplitMix64::new(23));
            let (wp, xp, yp) = (alloc(&w), alloc(&xq), alloc(&vec![0u8; ntok * nr * 4]));
            for variant in [MmqVariant::Wmma, MmqVariant::Dot4] {
                let name = abi::mmq_kernel(ty, variant == MmqVariant::Dot4).unwrap_or("mmq");
                let _ = api.take_stats();
                let r = ops.mmq(&s, ty, variant, wp, xp, yp, nr as u32, ntok as u32, kk as u32, nr as u32);
                let st = api.take_stats().unwrap_or_default();
                match r {
                    Ok(()) => {
                        let info = ops.kernel(name).map(|k| k.info.clone());
                        let ideal = (w.len() + xq.len() + ntok * nr * 4) as u64;
                        row(
                            &mut out,
                            name,
                            &format!("{nr}x{kk}x{ntok}"),
                            &st,
                            info.as_ref(),
                            abi::mmq_lds_bytes(ty),
                            ideal,
                            (nr * kk * ntok) as u64,
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(out, "{name}: {e}");
                    }
                }
            }
        }
    }
    // A prompt-sized chunk: 512 tokens = 8 column tiles, each reading the weights again.
    let ntok = if quick { 128usize } else { 512 };
    let xs: Vec<f32> = (0..ntok * kk).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut xq = vec![0u8; ntok * kk / 32 * 36];
    if quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq).is_ok() {
        let w = random_blocks(WType::Q8_0, nr * kk / 32, &mut SplitMix64::new(23));
        let (wp, xp, yp) = (alloc(&w), alloc(&xq), alloc(&vec![0u8; ntok * nr * 4]));
        let name = abi::mmq_kernel(WType::Q8_0, false).unwrap_or("mmq");
        let _ = api.take_stats();
        let r = ops.mmq(&s, WType::Q8_0, MmqVariant::Wmma, wp, xp, yp, nr as u32, ntok as u32, kk as u32, nr as u32);
        let st = api.take_stats().unwrap_or_default();
        match r {
            Ok(()) => {
                let info = ops.kernel(name).map(|k| k.info.clone());
                let ideal = (w.len() + xq.len() + ntok * nr * 4) as u64;
                row(
                    &mut out,
                    name,
                    &format!("{nr}x{kk}x{ntok}"),
                    &st,
                    info.as_ref(),
                    abi::mmq_lds_bytes(WType::Q8_0),
                    ideal,
                    (nr * kk * ntok) as u64,
                );
            }
            Err(e) => {
                let _ = writeln!(out, "{name}: {e}");
            }
        }
    }
    for p in bufs {
        let _ = api.free(p);
    }
    out
}
