//! hipBLASLt calibration (gpu-executor/src/calibrate.rs): the table's file format (round trip,
//! refusal of another architecture / hipBLASLt version, malformed and truncated files), the
//! T bucket rule and the hipBLAS fallback for missing rows; the software device's candidate
//! "algorithms" (blockings bit-identical to its GEMM); `strata calibrate --device emu` end to
//! end feeding `generate --calibration` (same text, GEMMs counted through the table); and the
//! real dlopen path against a stand-in `libhipblaslt.so` compiled here with gcc, whose four
//! fake algorithms have fixed simulated costs (one of them computes a wrong result), so the
//! enumeration, timing, rejection and choice are checked exactly.

use std::path::{Path, PathBuf};
use std::process::Command;
use strata::rng::SplitMix64;

use strata::gpu::calibrate::{
    self as cal, CalibrateOptions, CalibrationError, CalibrationTable, LtDispatch, Row, Shape,
};
use strata::gpu::device::{ComputeType, DType, EmuApi, Gemm, GpuApi, HipApi, HipConfig, Stream, Transpose};

use crate::models::models_util::reference;
use crate::support::strata_cmd as strata;

fn tmp(name: &str) -> PathBuf {
    crate::support::scratch_dir("calibrate").join(name)
}

fn row(dtype: &str, n: usize, k: usize, t: usize, algo: &str) -> Row {
    Row {
        dtype: dtype.into(),
        n,
        k,
        t,
        algo: algo.into(),
        algo_index: 1,
        workspace: 4096,
        median_us: 12.5,
        hipblas_us: Some(20.0),
        candidates: 5,
        rejected: 1,
    }
}

fn sample_table() -> CalibrationTable {
    let mut t = CalibrationTable::new("gfx1100:sramecc-:xnack-", "0.12.1", "Radeon RX 7900 XTX");
    for (i, tt) in [1, 8, 32, 128].into_iter().enumerate() {
        t.rows.push(row("f16", 4096, 4096, tt, &format!("a1{i:02x}00ff")));
    }
    t.rows.push(row("bf16", 1024, 4096, 8, "0102"));
    t.rows.push(row("f32", 256, 256, 1, "0203"));
    t
}

#[test]
fn calibration_table_round_trip() {
    let t = sample_table();
    assert_eq!(t.arch, "gfx1100", "features are stripped");
    let p = tmp("round-trip.json");
    t.save(&p).unwrap();
    let back = CalibrationTable::load(&p, "gfx1100", "0.12.1").unwrap();
    assert_eq!(back, t);
    // The device's arch may carry features; the table matches its base name.
    let back = CalibrationTable::load(&p, "gfx1100:sramecc-:xnack-", "0.12.1").unwrap();
    assert_eq!(back.rows.len(), 6);
    let a = CalibrationTable::algo(&back.rows[1]);
    assert_eq!((a.bytes, a.index, a.workspace), (vec![0xa1, 0x01, 0x00, 0xff], 1, 4096));
    // No temporary file is left next to the table.
    let left: Vec<_> = std::fs::read_dir(p.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("round-trip.tmp"))
        .collect();
    assert!(left.is_empty());
}

#[test]
fn calibration_table_for_another_arch_or_version_is_refused() {
    let p = tmp("mismatch.json");
    sample_table().save(&p).unwrap();
    for (arch, ver) in [("gfx1101", "0.12.1"), ("gfx1100", "0.13.0"), ("gfx1030", "0.10.0")] {
        let e = CalibrationTable::load(&p, arch, ver).unwrap_err();
        assert!(matches!(e, CalibrationError::Mismatch { .. }), "{e}");
        let msg = e.to_string();
        for needle in [p.to_str().unwrap(), "gfx1100", "0.12.1", arch, ver, "refused", "strata calibrate"] {
            assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
        }
    }
}

#[test]
fn calibration_malformed_and_truncated_files_are_named_errors() {
    let good = serde_json::to_string_pretty(&sample_table()).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_string(), "truncated"),
        ("empty", String::new(), "truncated"),
        ("not-json", "arch = gfx1100".into(), "malformed"),
        ("format", good.replace("\"format\": 1", "\"format\": 99"), "format 99"),
        ("dtype", good.replacen("\"bf16\"", "\"f8\"", 1), "dtype \"f8\""),
        ("hex", good.replacen("\"0102\"", "\"01x2\"", 1), "not hex"),
        ("zero", good.replacen("\"n\": 1024", "\"n\": 0", 1), "positive"),
        ("no-arch", good.replacen("\"arch\": \"gfx1100\"", "\"arch\": \"\"", 1), "empty arch"),
        ("missing-field", good.replacen("\"hipblaslt\": \"0.12.1\",", "", 1), "hipblaslt"),
    ];
    for (name, text, needle) in cases {
        let p = tmp(&format!("bad-{name}.json"));
        std::fs::write(&p, &text).unwrap();
        let e = CalibrationTable::load(&p, "gfx1100", "0.12.1").err().unwrap_or_else(|| panic!("{name}: accepted"));
        let msg = e.to_string();
        assert!(matches!(e, CalibrationError::Malformed { .. }), "{name}: {msg}");
        assert!(msg.contains(p.to_str().unwrap()) && msg.contains(needle), "{name}: {msg}");
    }
    // A duplicate row.
    let mut t = sample_table();
    t.rows.push(t.rows[0].clone());
    let p = tmp("bad-duplicate.json");
    std::fs::write(&p, serde_json::to_string(&t).unwrap()).unwrap();
    assert!(CalibrationTable::load(&p, "gfx1100", "0.12.1").unwrap_err().to_string().contains("duplicate row"));
    // A missing file names the path.
    let p = tmp("no-such-table.json");
    let e = CalibrationTable::load(&p, "gfx1100", "0.12.1").unwrap_err();
    assert!(matches!(e, CalibrationError::Io { .. }) && e.to_string().contains(p.to_str().unwrap()), "{e}");
}

#[test]
fn calibration_lookup_buckets_tokens_and_missing_rows_are_none() {
    let t = sample_table();
    let tt = |x: usize| t.lookup(DType::F16, 4096, 4096, x).map(|r| r.t);
    // Smallest measured T >= t; the largest beyond the last.
    assert_eq!(
        [tt(1), tt(2), tt(8), tt(9), tt(32), tt(33), tt(128), tt(129), tt(100_000)],
        [1, 8, 8, 32, 32, 128, 128, 128, 128].map(Some)
    );
    assert_eq!(t.lookup(DType::BF16, 1024, 4096, 1).map(|r| r.t), Some(8));
    assert!(t.lookup(DType::F32, 4096, 4096, 1).is_none(), "other dtype");
    assert!(t.lookup(DType::F16, 4096, 1024, 1).is_none(), "other K");
    assert!(t.lookup(DType::BF16, 4096, 4096, 1).is_none(), "other N");
}

// ---------------------------------------------------------------- software device

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A dense-layer GEMM `Y[t][n] = X[t][k] · W[n][k]ᵀ` in device memory; returns (gemm, c bytes).
fn dense_gemm(api: &dyn GpuApi, n: usize, k: usize, t: usize, dtype: DType) -> (Gemm, usize) {
    let enc = |v: &[f32]| -> Vec<u8> {
        match dtype {
            DType::F32 => f32_bytes(v),
            DType::F16 => v.iter().flat_map(|&x| quant::f32_to_f16(x).to_le_bytes()).collect(),
            DType::BF16 => v.iter().flat_map(|&x| quant::f32_to_bf16(x).to_le_bytes()).collect(),
        }
    };
    let (w, x) =
        (enc(&SplitMix64::new(1).symmetric_vec(n * k, 1.0)), enc(&SplitMix64::new(2).symmetric_vec(t * k, 1.0)));
    let (dw, dx, dc) = (api.malloc(w.len()).unwrap(), api.malloc(x.len()).unwrap(), api.malloc(n * t * 4).unwrap());
    api.memcpy_htod(dw, &w).unwrap();
    api.memcpy_htod(dx, &x).unwrap();
    let g = Gemm {
        trans_a: Transpose::T,
        trans_b: Transpose::N,
        m: n,
        n: t,
        k,
        alpha: 1.0,
        a: dw,
        a_type: dtype,
        lda: k,
        stride_a: 0,
        b: dx,
        b_type: dtype,
        ldb: k,
        stride_b: 0,
        beta: 0.0,
        c: dc,
        c_type: DType::F32,
        ldc: n,
        stride_c: 0,
        batch: 1,
        compute: ComputeType::F32,
    };
    (g, n * t * 4)
}

fn read(api: &dyn GpuApi, p: u64, bytes: usize) -> Vec<u8> {
    let mut b = vec![0u8; bytes];
    api.memcpy_dtoh(&mut b, p).unwrap();
    b
}

#[test]
fn emu_lt_candidates_are_bit_identical_to_the_gemm() {
    let api = EmuApi::new().unwrap();
    assert!(api.info().blas_lt_version.as_deref().unwrap().starts_with("emu-"));
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (g, cb) = dense_gemm(&api, 37, 70, 19, dtype);
        api.gemm(&Stream::DEFAULT, &g).unwrap();
        let want = read(&api, g.c, cb);
        let cands = api.gemm_lt_candidates(&g, 16).unwrap();
        assert_eq!(cands.len(), 3);
        assert_eq!(api.gemm_lt_candidates(&g, 2).unwrap().len(), 2, "max is honoured");
        for c in &cands {
            api.memset(g.c, 0xFF, cb).unwrap();
            api.gemm_lt(&Stream::DEFAULT, &g, c, 0, 0).unwrap();
            assert_eq!(read(&api, g.c, cb), want, "{dtype:?}: blocking {} differs from gemm", c.index);
        }
        let mut bad = cands[0].clone();
        bad.bytes = vec![1, 2, 3];
        assert!(
            api.gemm_lt(&Stream::DEFAULT, &g, &bad, 0, 0)
                .unwrap_err()
                .to_string()
                .contains("not a software-device blocking")
        );
    }
}

#[test]
fn emu_dispatch_uses_rows_and_falls_back_for_missing_ones() {
    let api = EmuApi::new().unwrap();
    let opts = CalibrateOptions { tokens: vec![1, 8], reps: 1, warmup: 0, max_candidates: 8 };
    let shapes = [Shape { dtype: DType::F32, n: 48, k: 64, min_t: 1 }];
    let (table, reports) = cal::calibrate(&api, &shapes, &opts, &mut |_| {}).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(table.rows.len(), 2);
    assert_eq!(
        (table.arch.as_str(), table.hipblaslt.as_str()),
        ("gfx1100", api.info().blas_lt_version.as_deref().unwrap())
    );
    for r in &table.rows {
        assert_eq!((r.candidates, r.rejected), (3, 0), "{r:?}");
        assert!(r.median_us > 0.0 && r.hipblas_us.is_some());
    }
    let d = LtDispatch::new(table, tmp("dispatch.json"), 0, 0);
    for (n, k, t, used) in
        [(48, 64, 1, true), (48, 64, 5, true), (48, 64, 40, true), (48, 32, 1, false), (32, 64, 1, false)]
    {
        let (g, cb) = dense_gemm(&api, n, k, t, DType::F32);
        api.gemm(&Stream::DEFAULT, &g).unwrap();
        let want = read(&api, g.c, cb);
        api.memset(g.c, 0, cb).unwrap();
        let took = d.try_gemm(&api, &Stream::DEFAULT, &g);
        assert_eq!(took, used, "N={n} K={k} T={t}");
        if took {
            assert_eq!(read(&api, g.c, cb), want, "N={n} K={k} T={t}: table algorithm differs from gemm");
        }
    }
    use std::sync::atomic::Ordering;
    assert_eq!((d.lt_calls.load(Ordering::Relaxed), d.fallback_calls.load(Ordering::Relaxed)), (3, 2));
}

// ---------------------------------------------------------------- CLI end to end (emu)

fn generate(model: &Path, calibration: Option<&Path>) -> (String, String) {
    let mut c = strata();
    c.args([
        "generate",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The quick brown fox jumps",
        "-n",
        "8",
        "--temp",
        "0",
        "--device",
        "emu",
    ]);
    if let Some(p) = calibration {
        c.arg("--calibration").arg(p);
    }
    let out = c.env_remove("STRATA_CALIBRATION").env("XDG_CACHE_HOME", tmp("no-cache")).output().unwrap();
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn cli_calibrate_emu_table_is_used_by_generate_with_identical_output() {
    // Mixed: F16 attention and head (f16 GEMMs on the device).
    let m = reference("tiny-qwen3moe/tiny-qwen3moe-v1024-mixed.gguf");
    let table = tmp("emu-table.json");
    let out = strata()
        .args(["calibrate", "-m", m.to_str().unwrap(), "--device", "emu", "--tokens", "1,8,32", "--reps", "2", "--out"])
        .arg(&table)
        .output()
        .unwrap();
    assert!(out.status.success(), "calibrate failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("wrote {}", table.display())));
    let api = EmuApi::new().unwrap();
    let t = CalibrationTable::load(&table, "gfx1100", api.info().blas_lt_version.as_deref().unwrap())
        .expect("written table loads");
    // The model's GEMM shapes: F16 head 1024x256, wq/wo 256x256, wk/wv 128x256 (f16 GEMMs), and
    // the f32 router 8x256.
    for (dt, n, k) in [(DType::F16, 1024, 256), (DType::F16, 256, 256), (DType::F16, 128, 256), (DType::F32, 8, 256)] {
        for tt in [1, 8, 32] {
            assert!(t.lookup(dt, n, k, tt).is_some_and(|r| r.t == tt), "no row {dt:?} N={n} K={k} T={tt}:\n{text}");
        }
    }
    assert_eq!(t.rows.len(), 12, "{text}");

    let (plain, _) = generate(&m, None);
    let (with, err) = generate(&m, Some(&table));
    assert_eq!(with, plain, "the table changed the output");
    let line =
        err.lines().find(|l| l.contains("hipBLASLt calibration")).unwrap_or_else(|| panic!("no usage line: {err}"));
    let used: u64 = line
        .rsplit(": ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(used > 0 && line.contains(" 0 on hipBLAS"), "{line}");

    // A table with only the head's rows: the other shapes fall back to hipBLAS (the host GEMM
    // here), the output is still the same.
    let mut head_only = t.clone();
    head_only.rows.retain(|r| r.n == 1024);
    let partial = tmp("emu-table-head-only.json");
    head_only.save(&partial).unwrap();
    let (with_partial, err) = generate(&m, Some(&partial));
    assert_eq!(with_partial, plain, "a partial table changed the output");
    let line =
        err.lines().find(|l| l.contains("hipBLASLt calibration")).unwrap_or_else(|| panic!("no usage line: {err}"));
    let nums: Vec<u64> =
        line.rsplit(": ").next().unwrap().split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    assert!(nums.len() == 2 && nums[0] > 0 && nums[1] > 0 && nums[1] > nums[0], "head only: {line}");

    // The same table with another arch is refused by generate, naming it.
    let bad = tmp("emu-table-gfx1101.json");
    std::fs::write(&bad, std::fs::read_to_string(&table).unwrap().replace("\"gfx1100\"", "\"gfx1101\"")).unwrap();
    let out = strata()
        .args(["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "1", "--device", "emu", "--calibration"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(bad.to_str().unwrap())
            && err.contains("gfx1101")
            && err.contains("refused")
            && !err.contains("panicked"),
        "{err}"
    );

    // calibrate on the CPU is a clear error.
    let out = strata().args(["calibrate", "--device", "cpu", "--out"]).arg(tmp("x.json")).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--device hip"));
}

// ---------------------------------------------------------------- HIP stand-in

/// A stand-in `libhipblaslt.so` (linked against the stand-in `libamdhip64.so` for its
/// simulated clock): four algorithms with workspaces 0/4/8/12 KiB and costs 0.5, 0.1, 0.2,
/// 0.3 ms; algorithm 1 (the fastest) computes a wrong result. f32 only.
const FAKE_LT_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stddef.h>
#ifndef LT_VERSION
#define LT_VERSION 1201
#endif
#define NALGO 4
extern double fake_clock_ms;
typedef struct { int ta, tb, compute, scale; } Desc;
typedef struct { int type; uint64_t rows, cols; int64_t ld; int batch; int64_t stride; } Layout;
typedef struct { uint64_t max_ws; } Pref;
typedef struct { uint8_t data[16]; size_t max_workspace_bytes; } Algo;
typedef struct { Algo algo; size_t workspaceSize; int state; float wavesCount; int reserved[4]; } Heur;
static const double cost_ms[NALGO] = {0.5, 0.1, 0.2, 0.3};
int hipblasLtCreate(void **h) { *h = malloc(8); return 0; }
int hipblasLtDestroy(void *h) { free(h); return 0; }
int hipblasLtGetVersion(void *h, int *v) { if (!h) return 1; *v = LT_VERSION; return 0; }
int hipblasLtMatmulDescCreate(void **d, int compute, int scale) {
    Desc *x = calloc(1, sizeof(Desc)); x->ta = x->tb = 111; x->compute = compute; x->scale = scale; *d = x; return 0; }
int hipblasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t n) {
    Desc *x = d; if (n != 4) return 3;
    if (attr == 0) x->ta = *(const int *)buf; else if (attr == 1) x->tb = *(const int *)buf; else return 3;
    return 0; }
int hipblasLtMatmulDescDestroy(void *d) { free(d); return 0; }
int hipblasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    Layout *x = calloc(1, sizeof(Layout)); x->type = type; x->rows = rows; x->cols = cols; x->ld = ld; x->batch = 1; *l = x;
    return ld < (int64_t)rows ? 3 : 0; }
int hipblasLtMatrixLayoutSetAttribute(void *l, int attr, const void *buf, size_t n) {
    Layout *x = l; if (attr == 0 && n == 4) x->batch = *(const int *)buf; else if (attr == 1 && n == 8) x->stride = *(const int64_t *)buf; else return 3;
    return 0; }
int hipblasLtMatrixLayoutDestroy(void *l) { free(l); return 0; }
int hipblasLtMatmulPreferenceCreate(void **p) { *p = calloc(1, sizeof(Pref)); return 0; }
int hipblasLtMatmulPreferenceSetAttribute(void *p, int attr, const void *buf, size_t n) {
    if (attr == 1 && n == 8) { ((Pref *)p)->max_ws = *(const uint64_t *)buf; return 0; } return 3; }
int hipblasLtMatmulPreferenceDestroy(void *p) { free(p); return 0; }
int hipblasLtMatmulAlgoGetHeuristic(void *h, void *d, void *a, void *b, void *c, void *dd, void *p, int req, Heur *res, int *ret) {
    Pref *pr = p; int n = 0;
    if (sizeof(Heur) != 56 || sizeof(Algo) != 24) return 6;
    for (int i = 0; i < NALGO && n < req; i++) {
        size_t ws = (size_t)i * 4096;
        if (ws > pr->max_ws) continue;
        memset(&res[n], 0, sizeof(Heur));
        res[n].algo.data[0] = 0xA1; res[n].algo.data[1] = (uint8_t)i; res[n].algo.max_workspace_bytes = ws;
        res[n].workspaceSize = ws; res[n].wavesCount = 1.0f; n++;
    }
    *ret = n; return n ? 0 : 7; }
int hipblasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *Ad, const void *B, void *Bd,
                    const void *beta, const void *C, void *Cd, void *D, void *Dd, const Algo *algo, void *ws, size_t wsn, void *stream) {
    Desc *ds = desc; Layout *la = Ad, *lb = Bd, *lc = Cd;
    if (!algo || algo->data[0] != 0xA1 || algo->data[1] >= NALGO) return 3;
    int id = algo->data[1];
    if (wsn < algo->max_workspace_bytes || (algo->max_workspace_bytes && !ws)) return 3;
    if (la->type != 0 || lb->type != 0 || lc->type != 0 || ds->compute != 2 || ds->scale != 0) return 7;
    uint64_t m = lc->rows, n = lc->cols, k = ds->ta == 111 ? la->cols : la->rows;
    float al = *(const float *)alpha, be = *(const float *)beta;
    const float *a = A, *b = B, *c = C; float *d = D;
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            float acc = 0;
            for (uint64_t l = 0; l < k; l++) {
                float av = ds->ta == 111 ? a[i + l * la->ld] : a[l + i * la->ld];
                float bv = ds->tb == 111 ? b[l + j * lb->ld] : b[j + l * lb->ld];
                acc += av * bv;
            }
            d[i + j * lc->ld] = al * acc + (be != 0 ? be * c[i + j * lc->ld] : 0);
        }
    if (id == 1) d[0] += 1.0f;
    fake_clock_ms += cost_ms[id];
    return 0; }
"#;

/// The stand-in HIP runtime plus the stand-in hipBLASLt (version `lt_version`) in one dir.
fn fake_hip_lt(variant: &str, lt_version: u32) -> Option<PathBuf> {
    let dir = crate::support::fake_hip(variant, &[])?;
    let src = dir.join("fake_hipblaslt.c");
    std::fs::write(&src, FAKE_LT_C).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libhipblaslt.so"))
        .arg(&src)
        .arg(format!("-DLT_VERSION={lt_version}"))
        .arg(format!("-L{}", dir.display()))
        .arg("-lamdhip64")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc failed on the stand-in hipBLASLt: {}", String::from_utf8_lossy(&out.stderr));
    Some(dir)
}

#[test]
fn hip_calibration_against_a_stand_in_hipblaslt() {
    let Some(dir) = fake_hip_lt("lt-0.12.1", 1201) else { return };
    let api = HipApi::open(&HipConfig::only_dir(&dir)).expect("stand-in accepted");
    let info = api.info();
    assert_eq!(info.blas_lt_version.as_deref(), Some("0.12.1"), "{info:?}");
    assert!(info.blas_lt.as_deref().unwrap().ends_with("libhipblaslt.so"), "{info:?}");

    // Candidates come from the heuristic with their workspace sizes.
    let (g, cb) = dense_gemm(&api, 24, 64, 8, DType::F32);
    let cands = api.gemm_lt_candidates(&g, 16).unwrap();
    assert_eq!(
        cands.iter().map(|c| (c.index, c.workspace, c.bytes.len())).collect::<Vec<_>>(),
        vec![(0, 0, 24), (1, 4096, 24), (2, 8192, 24), (3, 12288, 24)]
    );
    assert_eq!(api.gemm_lt_candidates(&g, 2).unwrap().len(), 2);
    // Too little workspace is refused before the library is called.
    assert!(
        api.gemm_lt(&Stream::DEFAULT, &g, &cands[2], 0, 100).unwrap_err().to_string().contains("8192 workspace bytes")
    );

    // Calibration: no hipBLAS in the dir, so the reference is the host GEMM. Algorithm 1 is the
    // fastest but wrong (dropped); 2 is the fastest correct one at exactly 0.2 ms.
    let opts = CalibrateOptions { tokens: vec![1, 8], reps: 3, warmup: 1, max_candidates: 16 };
    let shapes =
        [Shape { dtype: DType::F32, n: 24, k: 64, min_t: 1 }, Shape { dtype: DType::F16, n: 24, k: 64, min_t: 1 }];
    let mut seen = 0;
    let (table, reports) = cal::calibrate(&api, &shapes, &opts, &mut |_| seen += 1).unwrap();
    assert_eq!((seen, reports.len()), (4, 4));
    assert_eq!((table.arch.as_str(), table.hipblaslt.as_str()), ("gfx1100", "0.12.1"));
    assert_eq!(table.rows.len(), 2, "f16 is not supported by the stand-in: no rows, hipBLAS stays");
    for r in &table.rows {
        assert_eq!(
            (r.dtype.as_str(), r.algo_index, r.workspace, r.candidates, r.rejected),
            ("f32", 2, 8192, 4, 1),
            "{r:?}"
        );
        assert!((r.median_us - 200.0).abs() < 1e-2, "simulated 0.2 ms, got {} us", r.median_us);
        assert_eq!(r.hipblas_us, None);
        assert_eq!(&r.algo[..4], "a102");
    }
    let f16 = reports.iter().find(|r| r.shape.dtype == DType::F16).unwrap();
    assert!(f16.row.is_none() && f16.why_none.as_deref().unwrap().contains("HIPBLAS_STATUS_NOT_SUPPORTED"), "{f16:?}");

    // The saved table loads for this device, and dispatch runs the chosen algorithm correctly.
    let p = tmp("hip-stand-in.json");
    table.save(&p).unwrap();
    let t = CalibrationTable::load(&p, &info.arch, "0.12.1").unwrap();
    let ws = api.malloc(LtDispatch::workspace_needed(&t)).unwrap();
    let d = LtDispatch::new(t, p.clone(), ws, 8192);
    let mut host = vec![0u8; cb];
    {
        // Host reference over the same operands.
        let (mut a, mut b) = (vec![0u8; 24 * 64 * 4], vec![0u8; 8 * 64 * 4]);
        api.memcpy_dtoh(&mut a, g.a).unwrap();
        api.memcpy_dtoh(&mut b, g.b).unwrap();
        strata::gpu::device::gemm_ref::gemm_host(&g, &a, &b, &mut host);
    }
    api.memset(g.c, 0, cb).unwrap();
    assert!(d.try_gemm(&api, &Stream::DEFAULT, &g));
    let got: Vec<f32> =
        read(&api, g.c, cb).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let want: Vec<f32> = host.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "D[{i}] = {a}, want {b}");
    }

    // A stand-in hipBLASLt of another version: the table is refused, naming both versions.
    let Some(dir2) = fake_hip_lt("lt-0.13.0", 1300) else { return };
    let api2 = HipApi::open(&HipConfig::only_dir(&dir2)).unwrap();
    let v2 = api2.info().blas_lt_version.clone().unwrap();
    assert_eq!(v2, "0.13.0");
    let e = CalibrationTable::load(&p, &api2.info().arch, &v2).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, CalibrationError::Mismatch { .. })
            && msg.contains("0.12.1")
            && msg.contains("0.13.0")
            && msg.contains("refused"),
        "{msg}"
    );

    // A hipBLASLt older than the hipDataType API (0.6.0): off, with the reason; HIP still opens.
    let Some(dir3) = fake_hip_lt("lt-0.5.0", 500) else { return };
    let api3 = HipApi::open(&HipConfig::only_dir(&dir3)).unwrap();
    assert_eq!((api3.info().blas_lt.as_deref(), api3.info().blas_lt_version.as_deref()), (None, None));
    let e = api3.gemm_lt_candidates(&g, 4).unwrap_err().to_string();
    assert!(e.contains("hipBLASLt unavailable") && e.contains("0.5.0") && e.contains("0.6.0"), "{e}");
    let e = cal::calibrate(&api3, &shapes, &opts, &mut |_| {}).unwrap_err();
    assert!(matches!(e, CalibrationError::NoLt(_)) && e.to_string().contains("0.6.0"), "{e}");
}
