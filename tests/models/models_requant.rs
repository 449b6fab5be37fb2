//! Real weights in the quantizations people download: SmolLM2-135M-Instruct requantized by
//! llama.cpp's own quantizer into Q2_K (its mix, and pure), Q3_K_S/M/L, Q4_K_S, IQ3_S, IQ3_M and
//! IQ4_XS, and
//! llama.cpp's logits at every position of one prompt on each file. Both are made at test time
//! by testdata/reference/requant-smollm2/make_requant.py (`./setup.sh --test` runs it) into
//! testdata/generated/requant-smollm2; Strata's CPU logits must agree with llama.cpp's.

use std::path::PathBuf;

use strata::model::Logits;

use crate::models::models_util::ids;

/// Strata against llama.cpp is judged against llama.cpp against itself: the same file's logits
/// from its batched kernels (the reference) and from one token a call differ too (measured on
/// these files: mean |diff| 0.19-0.23, max 1.6-2.4, argmax 93-99%), since SmolLM2's logits are
/// large and every f16 rounding of the attention moves them. Strata's mean |diff| may be at most
/// this multiple of llama.cpp's own, its argmax agreement at most this much lower.
const MEAN_DIFF_FACTOR: f64 = 2.0;
const ARGMAX_SLACK: f64 = 0.05;

fn generated() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/generated/requant-smollm2"))
}

fn index() -> serde_json::Value {
    let p = generated().join("index.json");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (made by ./setup.sh --test: testdata/reference/requant-smollm2/make_requant.py with llama.cpp)",
            p.display()
        )
    });
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

/// `ftype`'s file: every quantized tensor dequantizes as gguf-py's does, byte for byte, and
/// the CPU logits agree with llama.cpp's, after checking the file really holds `ty` tensors
/// (llama.cpp falls back to other types where a row is not a multiple of 256).
fn check(ftype: &str, ty: &str) {
    let index = index();
    let entry = &index["types"][ftype];
    let n_ty = entry["tensor_types"][ty].as_u64().unwrap_or(0);
    assert!(n_ty > 0, "{ftype}: llama.cpp wrote no {ty} tensor: {}", entry["tensor_types"]);
    let path = generated().join(format!("{ftype}.gguf"));
    check_dequantization(&path, &entry["dequant_sha256"]);
    check_kernels(&path);

    let prompt = ids(&index["prompt_ids"]);
    let read = |suffix: &str| strata::npy::read_f32(&generated().join(format!("{ftype}.{suffix}.npy"))).unwrap();
    let ((shape, want), (_, single)) = (read("logits"), read("single"));
    let opts = strata::RunOptions { max_context: 512, ..Default::default() };
    let e = strata::Engine::load(&path, opts).unwrap();
    let mut sess = e.new_session().unwrap();
    let mut got = Vec::new();
    e.eval(&mut *sess, &prompt, Logits::All, &mut got).unwrap();
    assert_eq!(shape, vec![prompt.len(), e.model.n_vocab()]);
    assert_eq!(got.len(), want.len(), "{ftype}: logits shape");

    let ours = Agreement::of(&got, &want, shape[1]);
    let theirs = Agreement::of(&single, &want, shape[1]);
    eprintln!(
        "{ftype} ({n_ty} {ty} tensors, {}): Strata vs llama.cpp {ours}; llama.cpp one token a call vs batched {theirs}",
        entry["tensor_types"]
    );
    assert!(
        ours.mean <= MEAN_DIFF_FACTOR * theirs.mean,
        "{ftype}: mean |logit diff| {:.3} > {MEAN_DIFF_FACTOR} x llama.cpp's own {:.3}",
        ours.mean,
        theirs.mean
    );
    assert!(
        ours.argmax >= theirs.argmax.min(MIN_ARGMAX_AGREEMENT) - ARGMAX_SLACK,
        "{ftype}: argmax agrees at {:.3} of positions (llama.cpp with itself: {:.3})",
        ours.argmax,
        theirs.argmax
    );
}

/// The bound: argmax at ≥ 95% of positions, or llama.cpp's own agreement if lower.
const MIN_ARGMAX_AGREEMENT: f64 = 0.95;

/// How two `[positions][vocab]` logit arrays agree.
struct Agreement {
    mean: f64,
    max: f32,
    argmax: f64,
}

impl Agreement {
    fn of(a: &[f32], b: &[f32], vocab: usize) -> Agreement {
        let (mut sum, mut max, mut same) = (0f64, 0f32, 0usize);
        for (x, y) in a.chunks(vocab).zip(b.chunks(vocab)) {
            same += (strata::model::argmax(x) == strata::model::argmax(y)) as usize;
            for (p, q) in x.iter().zip(y) {
                let d = (p - q).abs();
                sum += d as f64;
                max = if d > max || d.is_nan() { d } else { max };
            }
        }
        let rows = a.len() / vocab;
        Agreement { mean: sum / a.len() as f64, max, argmax: same as f64 / rows as f64 }
    }
}

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mean |diff| {:.3}, max {:.2}, argmax {:.1}%", self.mean, self.max, 100.0 * self.argmax)
    }
}

/// Every quantized tensor's CPU products (every kernel path this CPU has, one column and a
/// prompt's 21) on its first rows of real weights, against `quant`'s scalar dot over the same
/// activations: what random blocks may miss (real scales, grid indices, sign patterns).
fn check_kernels(path: &std::path::Path) {
    use cpu_kernels::{Gemm, Path, QTensor, try_matmul_gemm};
    let file = gguf::GgufFile::open(path).unwrap();
    let mut rng = strata::rng::SplitMix64::new(7);
    for t in file.tensors().iter().filter(|t| t.ty.block_size() > 1 && t.dims.len() == 2) {
        let (k, rows) = (t.dims[0] as usize, (t.dims[1] as usize).min(48));
        let rb = t.ty.row_bytes(k).unwrap();
        let w = &file.tensor_data(t)[..rows * rb];
        let q = QTensor { ty: t.ty, data: w, rows, cols: k };
        for n in [1usize, 21] {
            let x = rng.symmetric_vec(n * k, 1.0);
            let at = t.ty.vec_dot_type();
            let mut want = vec![0f64; n * rows];
            for c in 0..n {
                let mut act = vec![0u8; at.row_bytes(k).unwrap()];
                quant::quantize_row(at, &x[c * k..(c + 1) * k], &mut act).unwrap();
                for r in 0..rows {
                    want[c * rows + r] = quant::vec_dot(t.ty, k, &w[r * rb..(r + 1) * rb], &act).unwrap() as f64;
                }
            }
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            for p in Path::all_available() {
                for gemm in [Gemm::Lanes, Gemm::Tiles] {
                    let mut y = vec![f32::NAN; n * rows];
                    try_matmul_gemm(p, gemm, &q, &x, n, &mut y).unwrap();
                    // As cpu-kernels' parity tests: the integer block sums are exact, the f32
                    // sums of blocks differ in order (and Q8_0 activations may round like
                    // llama.cpp's x86 quantizer, ~1e-4 of the largest output).
                    let err = y.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs() / scale).fold(0f64, f64::max);
                    assert!(
                        err <= 5e-4,
                        "{}: {} ({:?}) {p:?} {gemm:?} n={n}: relative error {err:.2e}",
                        path.display(),
                        t.name,
                        t.ty
                    );
                }
            }
        }
    }
}

/// Every quantized tensor of `path`, dequantized by the `quant` crate, hashes as gguf-py's
/// dequantization of it did (`want`: name → sha256 of the little-endian f32 values).
fn check_dequantization(path: &std::path::Path, want: &serde_json::Value) {
    use sha2::{Digest, Sha256};
    let file = gguf::GgufFile::open(path).unwrap();
    let want = want.as_object().expect("dequant_sha256 in index.json (re-run make_requant.py)");
    assert!(!want.is_empty());
    for t in file.tensors() {
        let Some(digest) = want.get(&t.name) else { continue };
        let row = t.dims[0] as usize;
        let n = t.dims.iter().product::<u64>() as usize;
        let mut deq = vec![0f32; n];
        let bytes = file.tensor_data(t);
        let row_bytes = bytes.len() / (n / row);
        for (src, dst) in bytes.chunks(row_bytes).zip(deq.chunks_mut(row)) {
            quant::dequantize_row(t.ty, src, dst).unwrap();
        }
        let mut h = Sha256::new();
        for x in &deq {
            h.update(x.to_le_bytes());
        }
        let got = format!("{:x}", h.finalize());
        assert_eq!(
            got,
            digest.as_str().unwrap(),
            "{}: {} ({:?}) dequantizes unlike gguf-py",
            path.display(),
            t.name,
            t.ty
        );
    }
}

// Each file against llama.cpp, naming the type its K/IQ tensors have: llama.cpp's mixes move
// ffn_down up a type (Q2_K writes it as Q3_K, Q3_K_M as Q4_K, Q3_K_L as Q5_K), so Q2_K itself
// comes from the pure file.

#[test]
fn requant_q2_k_matches_llama_cpp() {
    check("Q2_K", "q3_K");
}

#[test]
fn requant_q2_k_pure_matches_llama_cpp() {
    check("Q2_K-pure", "q2_K");
}

#[test]
fn requant_q3_k_s_matches_llama_cpp() {
    check("Q3_K_S", "q3_K");
}

#[test]
fn requant_q3_k_m_matches_llama_cpp() {
    check("Q3_K_M", "q4_K");
}

#[test]
fn requant_q3_k_l_matches_llama_cpp() {
    check("Q3_K_L", "q5_K");
}

#[test]
fn requant_q4_k_s_matches_llama_cpp() {
    check("Q4_K_S", "q4_K");
}

#[test]
fn requant_iq3_s_matches_llama_cpp() {
    check("IQ3_S", "iq3_s");
}

#[test]
fn requant_iq3_m_matches_llama_cpp() {
    check("IQ3_M", "iq3_s");
}

#[test]
fn requant_iq4_xs_matches_llama_cpp() {
    check("IQ4_XS", "iq4_xs");
}
