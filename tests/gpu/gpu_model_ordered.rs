//! The ordered-numerics mode (`GpuOptions::ordered` on the device, `Session::ordered` on the
//! CPU; the CLI's `--ordered`): the residual stream after EVERY layer and the logits are
//! bit-identical (`to_bits`) between the CPU backend and the GPU backend, for a prompt window,
//! a prompt longer than a window, and 20 greedy decode steps (each step's trace and logits
//! compared), on random-weight qwen3 (Q8_0, Q4_K, F32 with int8 KV), qwen3moe (Q8_0, Q4_K) and
//! gemma3-shaped models. Runs on the software RDNA3 device, and on a card when one is present.

use std::path::PathBuf;

use quant::GgmlType;
use strata::cpu::prelude::*;
use strata::gpu::model::{GpuModel, GpuOptions};
use strata::gpu::test_device::TestDevice;
use strata::kv_cache::KvType;
use strata::model::Decoder;
use strata::model::Logits;
use strata::test_device;

use crate::models::models_qwen3::qwen3_cfg;
use crate::models::models_util::{TinyCfg, TinyModel};
use strata::rng::SplitMix64;

fn tmp(name: &str) -> PathBuf {
    // One file per call: the emu and hip tests of one body run at once when a card is present.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("strata-gpu-ordered-{}-{n}-{name}", std::process::id()))
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// Panics with the first differing element (index, both values, max |diff|) unless `a` and
/// `b` are equal bit for bit.
fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let n = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        panic!(
            "{what}: not bit-identical: {n} of {} differ, first at {i}: gpu {:e} cpu {:e}; max |diff| {worst:e}",
            a.len(),
            a[i],
            b[i]
        );
    }
}

fn ordered_cpu_session(cpu: &Decoder, kv: KvType) -> strata::cpu::Session {
    let mut cs = cpu.new_session(kv, 64, 512);
    cs.ordered = true;
    cs.ordered_attention = true;
    cs
}

fn run_ordered(name: &str, cfg: TinyCfg, ty: GgmlType, kv: KvType, device: &TestDevice) {
    let path = tmp(&format!("{name}.gguf"));
    TinyModel::random(cfg.clone(), 7).write_gguf(&path, ty);
    let cpu = Decoder::load(&path).unwrap();
    let nv = cpu.n_vocab;
    let mut r = SplitMix64::new(99);
    let mut tok = || ((r.symmetric() + 1.0) * 0.5 * (nv - 1) as f32) as u32;
    // 7 tokens: one GPU window (traces line up with the CPU's single chunk).
    let prompt: Vec<u32> = (0..7).map(|_| tok()).collect();
    // 19 tokens: GPU windows of 8 + 8 + 3 against one CPU chunk (logits only).
    let long: Vec<u32> = (0..19).map(|_| tok()).collect();
    let forced: Vec<u32> = (0..6).map(|_| tok()).collect();
    {
        let (dev, api) = device.clone();
        let opts = GpuOptions { ordered: true, ..GpuOptions::default() };
        let gpu = GpuModel::new(Decoder::load(&path).unwrap(), api, opts).unwrap();

        let mut cs = ordered_cpu_session(&cpu, kv);
        let mut gs = gpu.new_session(kv, 64, 512).unwrap();
        let (mut cl, mut gl) = (Vec::new(), Vec::new());
        cpu.eval(&mut cs, &long, Logits::All, &mut cl).unwrap();
        gpu.eval(&mut gs, &long, Logits::All, &mut gl).unwrap();
        assert_bits(&format!("{name} [{dev}] 19-token prompt logits"), &gl, &cl);

        let mut cs = ordered_cpu_session(&cpu, kv);
        let mut gs = gpu.new_session(kv, 64, 512).unwrap();
        cs.trace = Some(Vec::new());
        gs.trace = Some(Vec::new());
        cpu.eval(&mut cs, &prompt, Logits::All, &mut cl).unwrap();
        gpu.eval(&mut gs, &prompt, Logits::All, &mut gl).unwrap();
        let check_trace = |step: &str, cs: &mut strata::cpu::Session, gs: &mut strata::gpu::model::GpuSession| {
            let (ct, gt) = (cs.trace.replace(Vec::new()).unwrap(), gs.trace.replace(Vec::new()).unwrap());
            assert_eq!(ct.len(), cfg.n_layer);
            assert_eq!(gt.len(), cfg.n_layer);
            for (il, (g, c)) in gt.iter().zip(&ct).enumerate() {
                assert_bits(&format!("{name} [{dev}] {step}: residual after layer {il}"), g, c);
            }
        };
        check_trace("prompt", &mut cs, &mut gs);
        assert_bits(&format!("{name} [{dev}] prompt logits"), &gl, &cl);

        let (mut tc, mut tg) = (argmax(&cl[(prompt.len() - 1) * nv..]), argmax(&gl[(prompt.len() - 1) * nv..]));
        let (mut oc, mut og) = (vec![tc], vec![tg]);
        for step in 0..20 {
            cpu.eval(&mut cs, &[tc], Logits::Last, &mut cl).unwrap();
            gpu.eval(&mut gs, &[tg], Logits::Last, &mut gl).unwrap();
            check_trace(&format!("decode step {step}"), &mut cs, &mut gs);
            assert_bits(&format!("{name} [{dev}] decode step {step} logits"), &gl, &cl);
            tc = argmax(&cl);
            tg = argmax(&gl);
            oc.push(tc);
            og.push(tg);
        }
        let distinct = {
            let mut v = oc.clone();
            v.sort();
            v.dedup();
            v.len()
        };
        eprintln!(
            "{name} [{dev}] ordered: every layer and logits bit-identical; 21/21 greedy tokens identical ({distinct} distinct): {og:?}"
        );
        assert_eq!(oc, og, "{name} [{dev}] greedy tokens");
        // Forced, varied decode inputs too (the Gemma-shaped model's greedy output repeats one
        // token: its tied, scaled embeddings echo the input).
        for step in 0..6 {
            let t = forced[step];
            cpu.eval(&mut cs, &[t], Logits::Last, &mut cl).unwrap();
            gpu.eval(&mut gs, &[t], Logits::Last, &mut gl).unwrap();
            check_trace(&format!("forced step {step}"), &mut cs, &mut gs);
            assert_bits(&format!("{name} [{dev}] forced step {step} logits"), &gl, &cl);
        }
    }
    let _ = std::fs::remove_file(&path);
}

test_device!(model fn gpu_model_ordered_qwen3_q8_0_bit_identical(device) {
    run_ordered("qwen3-q8_0", qwen3_cfg(), GgmlType::Q8_0, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_qwen3_f32_int8_kv_bit_identical(device) {
    run_ordered("qwen3-f32-int8kv", qwen3_cfg(), GgmlType::F32, KvType::Int8, device);
});

test_device!(model fn gpu_model_ordered_qwen3_q4_k_bit_identical(device) {
    let cfg = TinyCfg { n_embd: 256, n_ff: 256, n_head: 4, n_head_kv: 2, head_dim: 64, ..qwen3_cfg() };
    run_ordered("qwen3-q4_k", cfg, GgmlType::Q4K, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_qwen3moe_q8_0_bit_identical(device) {
    let cfg = TinyCfg { moe: Some((8, 2)), n_ff: 64, ..qwen3_cfg() };
    run_ordered("qwen3moe-q8_0", cfg, GgmlType::Q8_0, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_qwen3moe_q4_k_bit_identical(device) {
    let cfg = TinyCfg { moe: Some((8, 2)), n_embd: 256, n_ff: 256, n_head: 4, n_head_kv: 2, head_dim: 64, ..qwen3_cfg() };
    run_ordered("qwen3moe-q4_k", cfg, GgmlType::Q4K, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_gemma3_q8_0_bit_identical(device) {
    // Layers 0-4 slide over a 4-token window, layer 5 is global; GELU through the f16 table.
    let cfg = TinyCfg { n_layer: 6, gemma_window: Some(4), ..qwen3_cfg() };
    run_ordered("gemma3-q8_0", cfg, GgmlType::Q8_0, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_gemma3_q4_k_bit_identical(device) {
    let cfg = TinyCfg { n_layer: 3, gemma_window: Some(4), n_embd: 256, n_ff: 256, n_head: 4, n_head_kv: 2, head_dim: 64, ..qwen3_cfg() };
    run_ordered("gemma3-q4_k", cfg, GgmlType::Q4K, KvType::F16, device);
});

test_device!(model fn gpu_model_ordered_qwen3_f16_bit_identical(device) {
    run_ordered("qwen3-f16", qwen3_cfg(), GgmlType::F16, KvType::F16, device);
});

test_device!(
    /// The ordered kernels against the CPU code they copy, for every weight type with a reference
    /// dot: `quantize_ref` = `quant::quantize_row` byte for byte (Q8_0, Q8_1, Q8_K, F16, BF16, F32
    /// activations), `mmv_ordered` = `cpu::matmul_ordered` bit for bit (37 rows, 5 columns,
    /// k = 512, activations with outliers and exact zeros), `geglu_table` = `geglu_ggml` bit for bit
    /// (gates around the ±10 cut-offs, tiny and huge values).
    model fn gpu_model_ordered_kernels_equal_cpu_code(device) {
        use strata::gpu::ops::GpuOps;
        use strata::cpu::matmul_ordered;
        let (rows, ncols, k) = (37usize, 5usize, 512usize);
        let mut rng = SplitMix64::new(5);
        let mut x: Vec<f32> = (0..ncols * k).map(|_| rng.symmetric()).collect();
        x[3] = 40.0;
        x[k + 7] = -75.5;
        x[2 * k..2 * k + 256].iter_mut().for_each(|v| *v = 0.0); // an all-zero Q8_K block
        let wf: Vec<f32> = (0..rows * k).map(|_| rng.symmetric() * 0.5).collect();
        let types = [
            GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K,
            GgmlType::Q6K, GgmlType::IQ3XXS, GgmlType::IQ4NL, GgmlType::F16, GgmlType::BF16, GgmlType::F32,
        ];
        {
            let (dev, api) = device.clone();
            let ops = GpuOps::new(api.clone()).expect("kernels load and pass the metadata checks");
            let st = api.stream_create().unwrap();
            let put = |b: &[u8]| {
                let p = api.malloc(b.len().max(16)).unwrap();
                api.memcpy_htod(p, b).unwrap();
                p
            };
            let get = |p, n: usize| {
                api.stream_synchronize(&st).unwrap();
                let mut b = vec![0u8; n];
                api.memcpy_dtoh(&mut b, p).unwrap();
                b
            };
            let f32s = |b: Vec<u8>| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<f32>>();
            let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            let xd = put(&xb);
            for at in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
                let ab = at.row_bytes(k).unwrap();
                let mut want = vec![0u8; ncols * ab];
                for (c, a) in want.chunks_exact_mut(ab).enumerate() {
                    quant::quantize_row(at, &x[c * k..(c + 1) * k], a).unwrap();
                }
                let yd = put(&vec![0u8; want.len()]);
                ops.quantize_ref(&st, at, xd, yd, (ncols * k) as u32).unwrap();
                assert!(get(yd, want.len()) == want, "[{dev}] quantize_ref {} differs from quant::quantize_row", at.name());
                api.free(yd).unwrap();
            }
            for ty in types {
                let rb = ty.row_bytes(k).unwrap();
                let mut w = vec![0u8; rows * rb];
                for (r, dst) in w.chunks_exact_mut(rb).enumerate() {
                    quant::quantize_row(ty, &wf[r * k..(r + 1) * k], dst).unwrap();
                }
                let t = cpu_kernels::QTensor::new(ty, &w, rows, k).unwrap();
                let mut want = vec![0f32; ncols * rows];
                matmul_ordered(&t, &x, ncols, &mut want).unwrap();
                let at = ty.vec_dot_type();
                let ab = at.row_bytes(k).unwrap();
                let (wd, ad, yd) = (put(&w), put(&vec![0u8; ncols * ab]), put(&vec![0u8; ncols * rows * 4]));
                let a = if at == GgmlType::F32 { xd } else { ops.quantize_ref(&st, at, xd, ad, (ncols * k) as u32).map(|_| ad).unwrap() };
                ops.mmv_ordered(&st, ty, wd, a, yd, rows as u32, ncols as u32, k as u32).unwrap();
                let got = f32s(get(yd, ncols * rows * 4));
                assert_bits(&format!("[{dev}] mmv_ordered {}", ty.name()), &got, &want);
                for p in [wd, ad, yd] {
                    api.free(p).unwrap();
                }
            }
            // GELU through the f16 table.
            let n = 4096usize;
            let gate: Vec<f32> = (0..n)
                .map(|i| match i % 8 {
                    0 => -10.0,
                    1 => 10.0,
                    2 => -10.000001,
                    3 => 9.999999,
                    4 => rng.symmetric() * 1e-6,
                    5 => rng.symmetric() * 1e4,
                    _ => rng.symmetric() * 12.0,
                })
                .collect();
            let upv: Vec<f32> = (0..n).map(|_| rng.symmetric() * 3.0).collect();
            let mut want = vec![0f32; n];
            cpu_kernels::geglu_ggml(&gate, &upv, &mut want);
            let b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let (gd, ud, od) = (put(&b(&gate)), put(&b(&upv)), put(&vec![0u8; n * 4]));
            let td = put(&b(cpu_kernels::gelu_f16_table()));
            ops.geglu_table(&st, gd, ud, od, td, n as u32).unwrap();
            assert_bits(&format!("[{dev}] geglu_table"), &f32s(get(od, n * 4)), &want);
            for p in [gd, ud, od, td, xd] {
                api.free(p).unwrap();
            }
            eprintln!("[{dev}] ordered kernels: quantize_ref (6 activation types), mmv_ordered ({} weight types), geglu_table bit-identical", types.len());
        }
    }
);

/// Rust never contracts `a * b + c`, and the ordered kernels must keep it that way: no FMA in
/// `mmv_ordered` or `geglu_table_f32`, and in `quantize_ref` only the ones inside IEEE f32
/// divisions (between `v_div_scale_f32` and `v_div_fixup_f32`: the correctly rounded division
/// sequence); no f16
/// conversion folded into `v_fma_mix`. Checked on every embedded code object.
#[test]
fn gpu_model_ordered_kernels_isa_has_no_contraction() {
    use strata::gpu::abi;
    use strata::gpu::code_objects::code_objects;
    for (arch, bytes) in code_objects() {
        let path = std::env::temp_dir().join(format!("strata-ordered-isa-{arch}-{}.elf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let out =
            std::process::Command::new("llvm-objdump-22").args(["-d", &format!("--mcpu={arch}")]).arg(&path).output();
        let _ = std::fs::remove_file(&path);
        let dis = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => emulator::disassemble(bytes).expect("disassemble"),
        };
        let text = |name: &str| -> Vec<String> {
            let head = format!("<{name}>:");
            let start = dis.find(&head).unwrap_or_else(|| panic!("{arch}: {name} not in the disassembly"));
            dis[start + head.len()..].lines().skip(1).take_while(|l| !l.ends_with(">:")).map(str::to_string).collect()
        };
        let count = |lines: &[String], pats: &[&str]| {
            lines.iter().filter(|l| pats.iter().any(|p| l.trim_start().starts_with(p))).count()
        };
        let fmas =
            ["v_fma_f32", "v_fmac_f32", "v_fmamk_f32", "v_fmaak_f32", "v_fma_mix", "v_dot2", "v_fma_f16", "v_pk_fma"];
        for k in [abi::MMV_ORDERED, abi::GEGLU_TABLE] {
            let t = text(k);
            assert!(t.len() > 10, "{arch} {k}: empty");
            assert_eq!(count(&t, &fmas), 0, "{arch} {k}: contracted multiply-add");
        }
        let q = text(abi::QUANTIZE_REF);
        let divs = count(&q, &["v_div_fixup_f32"]);
        assert!(divs >= 4, "{arch}: quantize_ref: {divs} divisions");
        // Every FMA sits between a division's first v_div_scale_f32 and its v_div_fixup_f32.
        let (mut open, mut outside, mut inside) = (0usize, 0usize, 0usize);
        for l in &q {
            let l = l.trim_start();
            if l.starts_with("v_div_scale_f32") && open == 0 {
                open = 1;
            } else if l.starts_with("v_div_fixup_f32") {
                open = 0;
            } else if fmas.iter().any(|p| l.starts_with(p)) {
                if open > 0 { inside += 1 } else { outside += 1 }
            }
        }
        assert_eq!(outside, 0, "{arch}: quantize_ref: {outside} FMAs outside the IEEE divisions");
        assert!(inside >= 3 * divs, "{arch}: quantize_ref: {inside} FMAs in {divs} divisions");
        assert_eq!(count(&q, &["v_fma_mix"]), 0, "{arch}: quantize_ref: f16 conversion fused");
        eprintln!("{arch}: ordered kernels: no contraction ({divs} IEEE divisions in quantize_ref)");
    }
}
