//! Shared helpers of the model tests: locating the default model and the reference data, a
//! random-weight GGUF builder for the Qwen3 family, and an independent float64 scalar forward
//! pass (no code shared with the engine) to check the engine against.

use std::path::PathBuf;
use std::sync::OnceLock;

use gguf::{GgufWriter, Value};
use quant::GgmlType;

/// `shared/reference/<rel>` (next to the checkout, as in CI).
pub fn reference(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/reference")).join(rel)
}

pub fn read_json(rel: &str) -> serde_json::Value {
    let p = reference(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

/// The default model, which the tests expect to be present already (setup.sh fetches it).
pub fn default_model_path() -> PathBuf {
    let p = strata::fetch::model_dir().join(strata::fetch::DEFAULT_MODEL_FILE);
    assert!(
        p.is_file(),
        "default model not found at {} (run `strata generate -p hi` once or setup.sh to fetch it, or set STRATA_MODEL_DIR)",
        p.display()
    );
    p
}

/// One shared engine over the default model (loading is cheap thanks to mmap, but the test
/// binary runs tests in parallel and they can share it).
pub fn gemma() -> &'static strata::Engine {
    static E: OnceLock<strata::Engine> = OnceLock::new();
    E.get_or_init(|| {
        let opts = strata::RunOptions { max_context: 1024, ..Default::default() };
        strata::Engine::load(&default_model_path(), opts).expect("loading the default model")
    })
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Deterministic pseudo-random numbers (splitmix64) for weights.
pub struct Prng(u64);
impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(a)).collect()
    }
}

/// Shape of a small Qwen3 / Qwen3-MoE model.
#[derive(Clone, Debug)]
pub struct TinyCfg {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// (n_expert, n_expert_used) for qwen3moe; n_ff is then the expert width.
    pub moe: Option<(usize, usize)>,
    pub rope_base: f32,
    pub eps: f32,
    /// Write a Gemma-3-shaped model (`gemma3`: this sliding window, post norms, GELU, scaled
    /// and tied embeddings) instead of qwen3/qwen3moe. `reference_logits` does not model it.
    pub gemma_window: Option<usize>,
}

pub struct TinyLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    /// Dense: one matrix each; MoE: one per expert.
    pub gate: Vec<Vec<f32>>,
    pub up: Vec<Vec<f32>>,
    pub down: Vec<Vec<f32>>,
    pub router: Vec<f32>,
}

pub struct TinyModel {
    pub cfg: TinyCfg,
    pub tok_embd: Vec<f32>,
    pub output_norm: Vec<f32>,
    pub output: Vec<f32>,
    pub layers: Vec<TinyLayer>,
}

impl TinyModel {
    pub fn random(cfg: TinyCfg, seed: u64) -> TinyModel {
        let mut r = Prng::new(seed);
        let (d, hd) = (cfg.n_embd, cfg.head_dim);
        let (nq, nk) = (cfg.n_head * hd, cfg.n_head_kv * hd);
        let norm = |r: &mut Prng, n: usize| -> Vec<f32> { (0..n).map(|_| 1.0 + r.uniform(0.2)).collect() };
        let s = |n: usize| 1.0 / (n as f32).sqrt() * 1.7;
        let n_mats = cfg.moe.map(|m| m.0).unwrap_or(1);
        let layers = (0..cfg.n_layer)
            .map(|_| TinyLayer {
                attn_norm: norm(&mut r, d),
                wq: r.vec(nq * d, s(d)),
                wk: r.vec(nk * d, s(d)),
                wv: r.vec(nk * d, s(d)),
                wo: r.vec(d * nq, s(nq)),
                q_norm: norm(&mut r, hd),
                k_norm: norm(&mut r, hd),
                ffn_norm: norm(&mut r, d),
                gate: (0..n_mats).map(|_| r.vec(cfg.n_ff * d, s(d))).collect(),
                up: (0..n_mats).map(|_| r.vec(cfg.n_ff * d, s(d))).collect(),
                down: (0..n_mats).map(|_| r.vec(d * cfg.n_ff, s(cfg.n_ff))).collect(),
                router: cfg.moe.map(|(ne, _)| r.vec(ne * d, 2.0 * s(d))).unwrap_or_default(),
            })
            .collect();
        TinyModel {
            tok_embd: r.vec(cfg.n_vocab * d, 1.0),
            output_norm: norm(&mut r, d),
            output: r.vec(cfg.n_vocab * d, s(d)),
            layers,
            cfg,
        }
    }

    /// The same model with every matrix rounded through `ty` (quantize + dequantize), so the
    /// float64 reference sees exactly the weights the engine reads.
    pub fn roundtrip(mut self, ty: GgmlType) -> TinyModel {
        let d = self.cfg.n_embd;
        let nq = self.cfg.n_head * self.cfg.head_dim;
        let ff = self.cfg.n_ff;
        let rt = |v: &mut Vec<f32>, row: usize| {
            let mut buf = vec![0u8; ty.row_bytes(row).unwrap()];
            for r in v.chunks_mut(row) {
                quant::quantize_row(ty, r, &mut buf).unwrap();
                quant::dequantize_row(ty, &buf, r).unwrap();
            }
        };
        rt(&mut self.tok_embd, d);
        rt(&mut self.output, d);
        for l in &mut self.layers {
            for m in [&mut l.wq, &mut l.wk, &mut l.wv] {
                rt(m, d);
            }
            rt(&mut l.wo, nq);
            for m in l.gate.iter_mut().chain(l.up.iter_mut()) {
                rt(m, d);
            }
            for m in l.down.iter_mut() {
                rt(m, ff);
            }
        }
        self
    }

    /// Writes the model as a GGUF with every matrix in `ty` (F32, F16 or Q8_0).
    pub fn write_gguf(&self, path: &std::path::Path, ty: GgmlType) {
        self.write_gguf_mixed(path, ty, ty)
    }

    /// As `write_gguf`, with the FFN down matrices (dense or experts) in `down_ty` (as
    /// llama.cpp's Q4_K_M keeps `ffn_down` in Q6_K).
    pub fn write_gguf_mixed(&self, path: &std::path::Path, ty: GgmlType, down_ty: GgmlType) {
        let c = &self.cfg;
        let arch = match (c.gemma_window, c.moe) {
            (Some(_), _) => "gemma3",
            (None, Some(_)) => "qwen3moe",
            (None, None) => "qwen3",
        };
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::Str(arch.into()));
        let k = |s: &str| format!("{arch}.{s}");
        w.add_metadata(k("block_count"), Value::U32(c.n_layer as u32));
        w.add_metadata(k("context_length"), Value::U32(4096));
        w.add_metadata(k("embedding_length"), Value::U32(c.n_embd as u32));
        w.add_metadata(k("feed_forward_length"), Value::U32(c.n_ff as u32));
        w.add_metadata(k("attention.head_count"), Value::U32(c.n_head as u32));
        w.add_metadata(k("attention.head_count_kv"), Value::U32(c.n_head_kv as u32));
        w.add_metadata(k("attention.key_length"), Value::U32(c.head_dim as u32));
        w.add_metadata(k("attention.value_length"), Value::U32(c.head_dim as u32));
        w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(c.eps));
        w.add_metadata(k("rope.freq_base"), Value::F32(c.rope_base));
        if let Some(win) = c.gemma_window {
            w.add_metadata(k("attention.sliding_window"), Value::U32(win as u32));
        }
        if let Some((ne, nu)) = c.moe {
            w.add_metadata(k("expert_count"), Value::U32(ne as u32));
            w.add_metadata(k("expert_used_count"), Value::U32(nu as u32));
            w.add_metadata(k("expert_feed_forward_length"), Value::U32(c.n_ff as u32));
        }
        let enc = |data: &[f32], row: usize, ty: GgmlType| -> Vec<u8> {
            let mut out = vec![0u8; ty.row_bytes(row).expect("row size") * (data.len() / row)];
            let rb = out.len() / (data.len() / row);
            for (src, dst) in data.chunks(row).zip(out.chunks_mut(rb)) {
                quant::quantize_row(ty, src, dst).expect("quantize");
            }
            out
        };
        let f32v = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (d, hd, ff) = (c.n_embd as u64, c.head_dim as u64, c.n_ff as u64);
        let (nq, nk) = (c.n_head as u64 * hd, c.n_head_kv as u64 * hd);
        w.add_tensor("token_embd.weight", &[d, c.n_vocab as u64], ty, enc(&self.tok_embd, d as usize, ty));
        w.add_tensor("output_norm.weight", &[d], GgmlType::F32, f32v(&self.output_norm));
        if c.gemma_window.is_none() {
            w.add_tensor("output.weight", &[d, c.n_vocab as u64], ty, enc(&self.output, d as usize, ty));
        }
        for (il, l) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            w.add_tensor(n("attn_norm.weight"), &[d], GgmlType::F32, f32v(&l.attn_norm));
            w.add_tensor(n("attn_q.weight"), &[d, nq], ty, enc(&l.wq, d as usize, ty));
            w.add_tensor(n("attn_k.weight"), &[d, nk], ty, enc(&l.wk, d as usize, ty));
            w.add_tensor(n("attn_v.weight"), &[d, nk], ty, enc(&l.wv, d as usize, ty));
            w.add_tensor(n("attn_output.weight"), &[nq, d], ty, enc(&l.wo, nq as usize, ty));
            w.add_tensor(n("attn_q_norm.weight"), &[hd], GgmlType::F32, f32v(&l.q_norm));
            w.add_tensor(n("attn_k_norm.weight"), &[hd], GgmlType::F32, f32v(&l.k_norm));
            w.add_tensor(n("ffn_norm.weight"), &[d], GgmlType::F32, f32v(&l.ffn_norm));
            if c.gemma_window.is_some() {
                // Gemma's post norms: reuse the pre-norm weights reversed (any values work).
                let rev = |v: &[f32]| v.iter().rev().copied().collect::<Vec<f32>>();
                w.add_tensor(n("post_attention_norm.weight"), &[d], GgmlType::F32, f32v(&rev(&l.attn_norm)));
                w.add_tensor(n("post_ffw_norm.weight"), &[d], GgmlType::F32, f32v(&rev(&l.ffn_norm)));
            }
            match c.moe {
                None => {
                    w.add_tensor(n("ffn_gate.weight"), &[d, ff], ty, enc(&l.gate[0], d as usize, ty));
                    w.add_tensor(n("ffn_up.weight"), &[d, ff], ty, enc(&l.up[0], d as usize, ty));
                    w.add_tensor(n("ffn_down.weight"), &[ff, d], down_ty, enc(&l.down[0], ff as usize, down_ty));
                }
                Some((ne, _)) => {
                    let cat = |m: &[Vec<f32>]| m.concat();
                    w.add_tensor(n("ffn_gate_inp.weight"), &[d, ne as u64], GgmlType::F32, f32v(&l.router));
                    w.add_tensor(n("ffn_gate_exps.weight"), &[d, ff, ne as u64], ty, enc(&cat(&l.gate), d as usize, ty));
                    w.add_tensor(n("ffn_up_exps.weight"), &[d, ff, ne as u64], ty, enc(&cat(&l.up), d as usize, ty));
                    w.add_tensor(n("ffn_down_exps.weight"), &[ff, d, ne as u64], down_ty, enc(&cat(&l.down), ff as usize, down_ty));
                }
            }
        }
        w.write(path).expect("writing the tiny GGUF");
    }

    /// Plain float64 forward pass over the whole sequence: logits `[tokens][vocab]`.
    /// K and V are rounded to binary16 like the engine's (and llama.cpp's) f16 cache.
    pub fn reference_logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let c = &self.cfg;
        let (d, hd, nh, nkv) = (c.n_embd, c.head_dim, c.n_head, c.n_head_kv);
        let eps = c.eps as f64;
        let f = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
        let rms = |x: &[f64], w: &[f32]| -> Vec<f64> {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            let s = 1.0 / (ms + eps).sqrt();
            x.iter().zip(w).map(|(a, b)| a * s * *b as f64).collect()
        };
        // y[rows] = W[rows][cols] x
        let mv = |w: &[f32], x: &[f64]| -> Vec<f64> {
            w.chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| *a as f64 * b).sum()).collect()
        };
        let rope = |x: &mut [f64], pos: usize| {
            let half = hd / 2;
            for i in 0..half {
                let theta = pos as f64 * (c.rope_base as f64).powf(-2.0 * i as f64 / hd as f64);
                let (s, co) = theta.sin_cos();
                let (a, b) = (x[i], x[i + half]);
                x[i] = a * co - b * s;
                x[i + half] = a * s + b * co;
            }
        };
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let n = tokens.len();
        let mut xs: Vec<Vec<f64>> = tokens.iter().map(|&t| f(&self.tok_embd[t as usize * d..(t as usize + 1) * d])).collect();
        for l in &self.layers {
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let xn = rms(x, &l.attn_norm);
                let mut q = mv(&l.wq, &xn);
                let mut k = mv(&l.wk, &xn);
                let v = mv(&l.wv, &xn);
                for h in q.chunks_mut(hd) {
                    let y = rms(h, &l.q_norm);
                    h.copy_from_slice(&y);
                    rope(h, pos);
                }
                for h in k.chunks_mut(hd) {
                    let y = rms(h, &l.k_norm);
                    h.copy_from_slice(&y);
                    rope(h, pos);
                }
                qs.push(q);
                ks.push(k.iter().map(|&x| round_f16(x)).collect::<Vec<_>>());
                vs.push(v.iter().map(|&x| round_f16(x)).collect::<Vec<_>>());
            }
            for i in 0..n {
                let mut att = vec![0f64; nh * hd];
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let q = &qs[i][h * hd..(h + 1) * hd];
                    let sc: Vec<f64> = (0..=i)
                        .map(|j| q.iter().zip(&ks[j][g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt())
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for t in 0..hd {
                            att[h * hd + t] += ej / z * vs[j][g * hd + t];
                        }
                    }
                }
                let o = mv(&l.wo, &att);
                xs[i].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let xn = rms(&xs[i], &l.ffn_norm);
                let expert = |e: usize| -> Vec<f64> {
                    let g = mv(&l.gate[e], &xn);
                    let u = mv(&l.up[e], &xn);
                    let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
                    mv(&l.down[e], &a)
                };
                let y = match c.moe {
                    None => expert(0),
                    Some((ne, nu)) => {
                        let lg = mv(&l.router, &xn);
                        let m = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let p: Vec<f64> = lg.iter().map(|x| (x - m).exp()).collect();
                        let z: f64 = p.iter().sum();
                        let mut order: Vec<usize> = (0..ne).collect();
                        // Stable sort: equal probabilities keep the lower index first.
                        order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
                        let sel = &order[..nu];
                        let wsum: f64 = sel.iter().map(|&e| p[e] / z).sum();
                        let mut y = vec![0f64; d];
                        for &e in sel {
                            let w = p[e] / z / wsum;
                            y.iter_mut().zip(expert(e)).for_each(|(a, b)| *a += w * b);
                        }
                        y
                    }
                };
                xs[i].iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            }
        }
        xs.iter().map(|x| mv(&self.output, &rms(x, &self.output_norm))).collect()
    }
}

/// Nearest binary16 value (round half to even), computed independently of the engine.
pub fn round_f16(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = x.abs().log2().floor().max(-14.0);
    let q = 2f64.powf(e - 10.0);
    let r = (x / q).round_ties_even() * q;
    r.clamp(-65504.0, 65504.0)
}

/// Max |a - b| over two logit matrices, with the (row, col) where it occurs.
pub fn max_abs_diff(got: &[f32], want: &[Vec<f64>]) -> (f64, usize, usize) {
    let nv = want[0].len();
    let mut worst = (0f64, 0, 0);
    for (i, row) in want.iter().enumerate() {
        for (j, w) in row.iter().enumerate() {
            let d = (got[i * nv + j] as f64 - w).abs();
            if d > worst.0 || d.is_nan() {
                worst = (d, i, j);
            }
        }
    }
    worst
}
