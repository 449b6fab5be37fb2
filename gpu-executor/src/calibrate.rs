//! hipBLASLt calibration: which algorithm to use for each dense GEMM shape on this card.
//!
//! `strata calibrate` ([`calibrate`]) times every candidate algorithm hipBLASLt's heuristic
//! offers ([`GpuApi::gemm_lt_candidates`]) for each (dtype, N, K, T) — N output features, K
//! input features, T tokens, the shape of `Y[T][N] = X[T][K] · W[N][K]ᵀ` — after warm-up,
//! checks each result against hipBLAS (or the host GEMM) and drops algorithms whose result is
//! wrong, and writes the fastest into a [`CalibrationTable`] tied to the GPU architecture and
//! the hipBLASLt version (the algorithm bytes are only meaningful for that version).
//!
//! The engine loads a table with [`CalibrationTable::load`], which refuses, with a message
//! naming the file and what is wrong, a table for another architecture or hipBLASLt version,
//! or a malformed or truncated file; [`LtDispatch`] then routes the dense GEMMs of
//! `GpuModel` whose shape has a row through [`GpuApi::gemm_lt`]; a shape without a row (or
//! whose algorithm fails at run time) goes to hipBLAS ([`GpuApi::gemm`]) as before.
//!
//! **T buckets.** Rows are measured at a few token counts (`--tokens`, default 1,8,32,128,512).
//! A GEMM with `t` tokens uses the row of the smallest measured `T >= t`; beyond the largest
//! measured T it uses the largest. E.g. with 1,8,32,128,512: t = 1 → 1, 2..=8 → 8,
//! 9..=32 → 32, 33..=128 → 128, 129.. → 512.
//!
//! On the software device the "algorithms" are blockings of the host GEMM with identical
//! results (see `device::emu`), so the whole flow runs in CI; its timings are host timings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::device::gemm_ref::gemm_host;
use super::device::{ComputeType, DType, DevicePtr, Gemm, GpuApi, GpuError, LtAlgo, Stream, Transpose, arch_base};

/// Version of the file layout.
pub const TABLE_FORMAT: u32 = 1;

/// Default token counts measured.
pub const DEFAULT_TOKENS: [usize; 5] = [1, 8, 32, 128, 512];

/// A calibration table (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationTable {
    pub format: u32,
    /// `gcnArchName` without features, e.g. `gfx1100`.
    pub arch: String,
    /// hipBLASLt version (`DeviceInfo::blas_lt_version`).
    pub hipblaslt: String,
    /// The strata version that measured it (informational).
    pub strata: String,
    /// Device name (informational).
    pub device: String,
    pub rows: Vec<Row>,
}

/// The chosen algorithm of one (dtype, N, K, T).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Operand type of W and X: `f32`, `f16` or `bf16` (C is f32, f32 accumulation).
    pub dtype: String,
    /// Output features (rows of W).
    pub n: usize,
    /// Input features (columns of W).
    pub k: usize,
    /// Tokens measured.
    pub t: usize,
    /// `hipblasLtMatmulAlgo_t` bytes, hex.
    pub algo: String,
    /// Position of the algorithm in the heuristic's list.
    pub algo_index: u32,
    /// Workspace bytes the algorithm needs.
    pub workspace: usize,
    /// Median time of the chosen algorithm (µs).
    pub median_us: f64,
    /// Median time of hipBLAS on the same problem (µs), when hipBLAS was available.
    pub hipblas_us: Option<f64>,
    /// Candidates timed (including rejected ones).
    pub candidates: usize,
    /// Candidates dropped because their result was wrong or they failed.
    pub rejected: usize,
}

/// Why a table cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("calibration table {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("calibration table {path} is malformed: {why}")]
    Malformed { path: PathBuf, why: String },
    #[error(
        "calibration table {path} was measured for {table_arch} with hipBLASLt {table_lt}, but this device is {arch} with hipBLASLt {lt}: refused (run `strata calibrate` on this machine)"
    )]
    Mismatch { path: PathBuf, table_arch: String, table_lt: String, arch: String, lt: String },
    #[error("calibration: this device has no hipBLASLt ({0})")]
    NoLt(String),
    #[error("calibration: {0}")]
    Gpu(#[from] GpuError),
}

pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

pub fn parse_dtype(s: &str) -> Option<DType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" => Some(DType::F32),
        "f16" => Some(DType::F16),
        "bf16" => Some(DType::BF16),
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// `~/.cache/strata/calibration/<arch>-hipblaslt-<version>.json` (`$XDG_CACHE_HOME` first).
pub fn default_path(arch: &str, lt_version: &str) -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    let safe = |s: &str| {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect::<String>()
    };
    Some(base.join("strata/calibration").join(format!("{}-hipblaslt-{}.json", safe(arch_base(arch)), safe(lt_version))))
}

impl CalibrationTable {
    pub fn new(arch: &str, hipblaslt: &str, device: &str) -> Self {
        CalibrationTable {
            format: TABLE_FORMAT,
            arch: arch_base(arch).to_string(),
            hipblaslt: hipblaslt.to_string(),
            strata: env!("CARGO_PKG_VERSION").to_string(),
            device: device.to_string(),
            rows: Vec::new(),
        }
    }

    /// Parses and checks a table (no device check: see [`CalibrationTable::check_device`]).
    pub fn parse(path: &Path, text: &str) -> Result<Self, CalibrationError> {
        let bad = |why: String| CalibrationError::Malformed { path: path.to_path_buf(), why };
        let t: CalibrationTable = serde_json::from_str(text)
            .map_err(|e| if e.is_eof() { bad(format!("truncated ({e})")) } else { bad(e.to_string()) })?;
        if t.format != TABLE_FORMAT {
            return Err(bad(format!("format {} (this strata reads format {TABLE_FORMAT})", t.format)));
        }
        if t.arch.is_empty() || t.hipblaslt.is_empty() {
            return Err(bad("empty arch or hipblaslt version".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in t.rows.iter().enumerate() {
            let what = format!("row {i} ({} N={} K={} T={})", r.dtype, r.n, r.k, r.t);
            if parse_dtype(&r.dtype).is_none() {
                return Err(bad(format!("{what}: dtype {:?} is not f32, f16 or bf16", r.dtype)));
            }
            if r.n == 0 || r.k == 0 || r.t == 0 {
                return Err(bad(format!("{what}: N, K and T must be positive")));
            }
            match unhex(&r.algo) {
                Some(b) if !b.is_empty() => {}
                _ => return Err(bad(format!("{what}: algo {:?} is not hex bytes", r.algo))),
            }
            if !seen.insert((r.dtype.to_ascii_lowercase(), r.n, r.k, r.t)) {
                return Err(bad(format!("{what}: duplicate row")));
            }
        }
        Ok(t)
    }

    /// Reads, parses and checks a table against the device (`arch`, hipBLASLt version).
    pub fn load(path: &Path, arch: &str, lt_version: &str) -> Result<Self, CalibrationError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CalibrationError::Io { path: path.to_path_buf(), source })?;
        let t = Self::parse(path, &text)?;
        t.check_device(path, arch, lt_version)?;
        Ok(t)
    }

    /// Refuses a table measured on another architecture or hipBLASLt version.
    pub fn check_device(&self, path: &Path, arch: &str, lt_version: &str) -> Result<(), CalibrationError> {
        if arch_base(&self.arch) != arch_base(arch) || self.hipblaslt != lt_version {
            return Err(CalibrationError::Mismatch {
                path: path.to_path_buf(),
                table_arch: self.arch.clone(),
                table_lt: self.hipblaslt.clone(),
                arch: arch_base(arch).to_string(),
                lt: lt_version.to_string(),
            });
        }
        Ok(())
    }

    /// Writes the table atomically (a temporary file in the same directory, then rename).
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let io = |source| CalibrationError::Io { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| CalibrationError::Malformed { path: path.to_path_buf(), why: e.to_string() })?;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, text + "\n").map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    /// The row for a GEMM of `t` tokens (see the module docs for the T bucket rule).
    pub fn lookup(&self, dtype: DType, n: usize, k: usize, t: usize) -> Option<&Row> {
        let name = dtype_name(dtype);
        let mut best: Option<&Row> = None;
        let mut largest: Option<&Row> = None;
        for r in self.rows.iter().filter(|r| r.dtype.eq_ignore_ascii_case(name) && r.n == n && r.k == k) {
            if r.t >= t && best.is_none_or(|b| r.t < b.t) {
                best = Some(r);
            }
            if largest.is_none_or(|l| r.t > l.t) {
                largest = Some(r);
            }
        }
        best.or(largest)
    }

    /// The algorithm of a row.
    pub fn algo(row: &Row) -> LtAlgo {
        LtAlgo { index: row.algo_index, bytes: unhex(&row.algo).unwrap_or_default(), workspace: row.workspace }
    }
}

// ---------------------------------------------------------------- engine use

/// (dtype, N, K) → (T, algorithm) sorted by T.
type AlgoIndex = HashMap<(&'static str, usize, usize), Vec<(usize, LtAlgo)>>;

/// A loaded table bound to a device: routes dense GEMMs whose shape has a row through
/// hipBLASLt. Counts what it did and says so on drop (one stderr line).
pub struct LtDispatch {
    table: CalibrationTable,
    /// (dtype, n, k) → rows sorted by T, resolved once.
    index: AlgoIndex,
    source: PathBuf,
    workspace: DevicePtr,
    workspace_bytes: usize,
    /// GEMMs run through hipBLASLt / left to hipBLAS.
    pub lt_calls: AtomicU64,
    pub fallback_calls: AtomicU64,
    /// Rows whose algorithm failed at run time: hipBLAS from then on.
    failed: Mutex<Vec<(&'static str, usize, usize, usize)>>,
}

impl LtDispatch {
    /// `workspace`: device memory of `workspace_bytes` (at least [`LtDispatch::workspace_needed`]).
    pub fn new(table: CalibrationTable, source: PathBuf, workspace: DevicePtr, workspace_bytes: usize) -> Self {
        let mut index = AlgoIndex::new();
        for r in &table.rows {
            if let Some(d) = parse_dtype(&r.dtype) {
                index.entry((dtype_name(d), r.n, r.k)).or_default().push((r.t, CalibrationTable::algo(r)));
            }
        }
        for v in index.values_mut() {
            v.sort_by_key(|(t, _)| *t);
        }
        LtDispatch {
            table,
            index,
            source,
            workspace,
            workspace_bytes,
            lt_calls: AtomicU64::new(0),
            fallback_calls: AtomicU64::new(0),
            failed: Mutex::new(Vec::new()),
        }
    }

    /// The largest workspace any row needs.
    pub fn workspace_needed(table: &CalibrationTable) -> usize {
        table.rows.iter().map(|r| r.workspace).max().unwrap_or(0)
    }

    pub fn table(&self) -> &CalibrationTable {
        &self.table
    }

    /// Runs `g` through hipBLASLt when the table has a row for its shape and `g` has the form
    /// the rows were measured in (the dense layer: `trans_a = T`, `trans_b = N`, batch 1,
    /// alpha 1, beta 0, f32 output and compute; m = N, k = K, n = T).
    /// Returns false when the caller must use hipBLAS (no row, another form, or the
    /// algorithm failed: then that row is not tried again and a message is printed once).
    pub fn try_gemm(&self, api: &dyn GpuApi, stream: &Stream, g: &Gemm) -> bool {
        let dense = g.trans_a == Transpose::T
            && g.trans_b == Transpose::N
            && g.batch == 1
            && g.a_type == g.b_type
            && g.c_type == DType::F32
            && g.compute == ComputeType::F32
            && g.alpha == 1.0
            && g.beta == 0.0;
        let name = dtype_name(g.a_type);
        let algo = if dense {
            self.index.get(&(name, g.m, g.k)).and_then(|rows| rows.iter().find(|(t, _)| *t >= g.n).or(rows.last()))
        } else {
            None
        };
        let Some((t, algo)) = algo else {
            self.fallback_calls.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let key = (name, g.m, g.k, *t);
        if self.failed.lock().map(|f| f.contains(&key)).unwrap_or(true) {
            self.fallback_calls.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match api.gemm_lt(stream, g, algo, self.workspace, self.workspace_bytes) {
            Ok(()) => {
                self.lt_calls.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                eprintln!(
                    "strata: hipBLASLt algorithm of {name} N={} K={} T={t} from {} failed ({e}); using hipBLAS for it",
                    g.m,
                    g.k,
                    self.source.display()
                );
                if let Ok(mut f) = self.failed.lock() {
                    f.push(key);
                }
                self.fallback_calls.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

impl Drop for LtDispatch {
    fn drop(&mut self) {
        eprintln!(
            "strata: hipBLASLt calibration {}: {} GEMMs through the table, {} on hipBLAS",
            self.source.display(),
            self.lt_calls.load(Ordering::Relaxed),
            self.fallback_calls.load(Ordering::Relaxed)
        );
    }
}

// ---------------------------------------------------------------- measuring

/// A dense projection shape: `Y[T][n] = X[T][k] · W[n][k]ᵀ` with W and X of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub dtype: DType,
    pub n: usize,
    pub k: usize,
    /// Smallest token count worth measuring (e.g. 32 for quantized matrices, which use the
    /// GEMM only on prompt chunks).
    pub min_t: usize,
}

/// Built-in shapes when no model is given: Qwen3-8B/Gemma-3-like attention and FFN matrices.
pub fn builtin_shapes(dtypes: &[DType]) -> Vec<Shape> {
    let nk = [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288), (2048, 2048), (8192, 2048), (2048, 8192)];
    dtypes.iter().flat_map(|&dtype| nk.iter().map(move |&(n, k)| Shape { dtype, n, k, min_t: 1 })).collect()
}

/// Options of [`calibrate`].
#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    pub tokens: Vec<usize>,
    /// Timed runs per candidate (median taken).
    pub reps: usize,
    /// Untimed runs first.
    pub warmup: usize,
    /// Most candidates asked from the heuristic.
    pub max_candidates: usize,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions { tokens: DEFAULT_TOKENS.to_vec(), reps: 10, warmup: 2, max_candidates: 16 }
    }
}

/// What happened to one problem (progress and report).
#[derive(Clone, Debug)]
pub struct ProblemReport {
    pub shape: Shape,
    pub t: usize,
    /// The chosen row, None when no candidate was correct (the shape stays on hipBLAS).
    pub row: Option<Row>,
    pub why_none: Option<String>,
}

/// Deterministic operand values in [-1, 1).
fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn encode(d: DType, v: &[f32]) -> Vec<u8> {
    match d {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v.iter().flat_map(|&x| quant::f32_to_f16(x).to_le_bytes()).collect(),
        DType::BF16 => v.iter().flat_map(|&x| quant::f32_to_bf16(x).to_le_bytes()).collect(),
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Tolerance of a candidate's result against the reference: max |got − ref| ≤ tol · max |ref|.
/// Candidates differ from the reference only in summation order (f32 accumulation).
pub fn tolerance(d: DType) -> f32 {
    match d {
        DType::F32 => 1e-4,
        DType::F16 | DType::BF16 => 1e-2,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Device buffers of one problem, freed on drop.
struct Bufs<'a> {
    api: &'a dyn GpuApi,
    ptrs: Vec<DevicePtr>,
}
impl Bufs<'_> {
    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        let p = self.api.malloc(bytes.max(16))?;
        self.ptrs.push(p);
        Ok(p)
    }
}
impl Drop for Bufs<'_> {
    fn drop(&mut self) {
        for p in self.ptrs.drain(..) {
            let _ = self.api.free(p);
        }
    }
}

/// Times `f` once on `stream` (µs): device events when the backend has a timer, else the
/// wall clock around the call and a stream synchronisation.
fn time_once(
    api: &dyn GpuApi,
    s: &Stream,
    e0: &super::device::Event,
    e1: &super::device::Event,
    f: &dyn Fn() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let t0 = std::time::Instant::now();
    api.event_record(e0, s)?;
    f()?;
    api.event_record(e1, s)?;
    api.event_synchronize(e1)?;
    api.stream_synchronize(s)?;
    let wall = t0.elapsed().as_secs_f64() * 1e6;
    Ok(match api.event_elapsed_ms(e0, e1)? {
        Some(ms) => ms as f64 * 1e3,
        None => wall,
    })
}

/// Measures every (shape, T) and returns the table (rows only for problems with at least one
/// correct candidate) and a report per problem. `progress` is called after each problem.
pub fn calibrate(
    api: &dyn GpuApi,
    shapes: &[Shape],
    opts: &CalibrateOptions,
    progress: &mut dyn FnMut(&ProblemReport),
) -> Result<(CalibrationTable, Vec<ProblemReport>), CalibrationError> {
    let info = api.info();
    let version = info.blas_lt_version.clone().ok_or_else(|| {
        CalibrationError::NoLt(
            api.gemm_lt_candidates(&dummy_gemm(), 1)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "no version".into()),
        )
    })?;
    let mut table = CalibrationTable::new(&info.arch, &version, &info.name);
    let mut reports = Vec::new();
    let stream = api.stream_create()?;
    let e0 = api.event_create_timing()?;
    let e1 = api.event_create_timing()?;
    let result = (|| -> Result<(), CalibrationError> {
        let mut seen = std::collections::HashSet::new();
        for sh in shapes {
            for &t in &opts.tokens {
                if t < sh.min_t || !seen.insert((sh.dtype, sh.n, sh.k, t)) {
                    continue;
                }
                let rep = measure(api, &stream, &e0, &e1, *sh, t, opts)?;
                if let Some(r) = &rep.row {
                    table.rows.push(r.clone());
                }
                progress(&rep);
                reports.push(rep);
            }
        }
        Ok(())
    })();
    let _ = api.event_destroy(e0);
    let _ = api.event_destroy(e1);
    let _ = api.stream_destroy(stream);
    result?;
    Ok((table, reports))
}

fn dummy_gemm() -> Gemm {
    Gemm {
        trans_a: Transpose::T,
        trans_b: Transpose::N,
        m: 1,
        n: 1,
        k: 1,
        alpha: 1.0,
        a: 0,
        a_type: DType::F32,
        lda: 1,
        stride_a: 0,
        b: 0,
        b_type: DType::F32,
        ldb: 1,
        stride_b: 0,
        beta: 0.0,
        c: 0,
        c_type: DType::F32,
        ldc: 1,
        stride_c: 0,
        batch: 1,
        compute: ComputeType::F32,
    }
}

fn measure(
    api: &dyn GpuApi,
    s: &Stream,
    e0: &super::device::Event,
    e1: &super::device::Event,
    sh: Shape,
    t: usize,
    opts: &CalibrateOptions,
) -> Result<ProblemReport, CalibrationError> {
    let (n, k) = (sh.n, sh.k);
    let mut bufs = Bufs { api, ptrs: Vec::new() };
    let w = fill(n * k, (n * 31 + k) as u64);
    let x = fill(t * k, (t * 17 + k) as u64);
    let (wb, xb) = (encode(sh.dtype, &w), encode(sh.dtype, &x));
    let (dw, dx) = (bufs.alloc(wb.len())?, bufs.alloc(xb.len())?);
    let (dref, dc) = (bufs.alloc(t * n * 4)?, bufs.alloc(t * n * 4)?);
    api.memcpy_htod(dw, &wb)?;
    api.memcpy_htod(dx, &xb)?;
    let gemm = |c: DevicePtr| Gemm {
        trans_a: Transpose::T,
        trans_b: Transpose::N,
        m: n,
        n: t,
        k,
        alpha: 1.0,
        a: dw,
        a_type: sh.dtype,
        lda: k,
        stride_a: 0,
        b: dx,
        b_type: sh.dtype,
        ldb: k,
        stride_b: 0,
        beta: 0.0,
        c,
        c_type: DType::F32,
        ldc: n,
        stride_c: 0,
        batch: 1,
        compute: ComputeType::F32,
    };
    // Reference: hipBLAS (the host GEMM on the software device); without hipBLAS, the host
    // GEMM over the same operands.
    let g_ref = gemm(dref);
    let mut hipblas_us = None;
    let reference: Vec<f32> = match api.gemm(s, &g_ref).and_then(|_| api.stream_synchronize(s)) {
        Ok(()) => {
            let mut times = Vec::new();
            for _ in 0..opts.warmup {
                api.gemm(s, &g_ref)?;
            }
            for _ in 0..opts.reps.max(1) {
                times.push(time_once(api, s, e0, e1, &|| api.gemm(s, &g_ref))?);
            }
            hipblas_us = Some(median(&mut times));
            let mut b = vec![0u8; t * n * 4];
            api.memcpy_dtoh(&mut b, dref)?;
            f32s(&b)
        }
        Err(_) => {
            let mut c = vec![0u8; t * n * 4];
            gemm_host(&g_ref, &wb, &xb, &mut c);
            f32s(&c)
        }
    };
    let ref_max = reference.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let g = gemm(dc);
    let cands = match api.gemm_lt_candidates(&g, opts.max_candidates) {
        Ok(c) => c,
        Err(e) => return Ok(ProblemReport { shape: sh, t, row: None, why_none: Some(format!("no candidates: {e}")) }),
    };
    if cands.is_empty() {
        return Ok(ProblemReport { shape: sh, t, row: None, why_none: Some("hipBLASLt offered no algorithm".into()) });
    }
    let ws_bytes = cands.iter().map(|c| c.workspace).max().unwrap_or(0);
    let ws = if ws_bytes > 0 { bufs.alloc(ws_bytes)? } else { 0 };
    let mut best: Option<(f64, &LtAlgo)> = None;
    let mut rejected = 0;
    let mut reasons = Vec::new();
    for cand in &cands {
        let run = || api.gemm_lt(s, &g, cand, ws, ws_bytes);
        let outcome = (|| -> Result<Option<f64>, GpuError> {
            api.memset(dc, 0xFF, t * n * 4)?; // NaN: an algorithm that writes nothing fails the check
            run()?;
            api.stream_synchronize(s)?;
            let mut b = vec![0u8; t * n * 4];
            api.memcpy_dtoh(&mut b, dc)?;
            let got = f32s(&b);
            let err = got
                .iter()
                .zip(&reference)
                .fold(0f32, |m, (a, b)| if (a - b).is_nan() { f32::INFINITY } else { m.max((a - b).abs()) });
            if err > tolerance(sh.dtype) * ref_max {
                return Ok(None);
            }
            for _ in 0..opts.warmup {
                run()?;
            }
            let mut times = Vec::new();
            for _ in 0..opts.reps.max(1) {
                times.push(time_once(api, s, e0, e1, &run)?);
            }
            Ok(Some(median(&mut times)))
        })();
        match outcome {
            Ok(Some(us)) => {
                if best.is_none_or(|(b, _)| us < b) {
                    best = Some((us, cand));
                }
            }
            Ok(None) => {
                rejected += 1;
                reasons.push(format!("algorithm {}: wrong result", cand.index));
            }
            Err(e) => {
                rejected += 1;
                reasons.push(format!("algorithm {}: {e}", cand.index));
            }
        }
    }
    let row = best.map(|(us, a)| Row {
        dtype: dtype_name(sh.dtype).into(),
        n,
        k,
        t,
        algo: hex(&a.bytes),
        algo_index: a.index,
        workspace: a.workspace,
        median_us: us,
        hipblas_us,
        candidates: cands.len(),
        rejected,
    });
    let why_none = row.is_none().then(|| reasons.join("; "));
    Ok(ProblemReport { shape: sh, t, row, why_none })
}

/// The dense projection shapes `GpuModel` sends to the GEMM entry point for `model`, in the
/// type it uses — f16 for F16 weights and for MMVQ-type layer matrices (dequantized to f16 for
/// prompt chunks of [`crate::options::GEMM_MIN_TOKENS`] tokens or more, `min_t`), f32 for the
/// rest (widened at upload) — and, for each extra dtype in `extra`, the same shapes in that type.
pub fn model_shapes(model: &model::Decoder, extra: &[DType]) -> Vec<Shape> {
    use model::{Ffn, Mat};
    let mut mats: Vec<(&Mat, bool)> = vec![(&model.w.output, false)];
    for l in &model.w.layers {
        let a = &l.attn;
        mats.extend([(&a.wq, true), (&a.wk, true), (&a.wv, true), (&a.wo, true)]);
        match &l.ffn.ffn {
            Ffn::Dense { gate, up, down } => mats.extend([(gate, true), (up, true), (down, true)]),
            Ffn::Moe { router, gate, up, down } => {
                mats.extend([(router, false), (gate, false), (up, false), (down, false)])
            }
        }
    }
    let mut out: Vec<Shape> = Vec::new();
    for (w, layer_mat) in mats {
        let mmvq = super::abi::WType::from_ggml_id(w.ty as u32).is_some_and(|t| w.cols % t.block_k() as usize == 0);
        // MMVQ matrices outside the layer projections (head, experts) never take the GEMM path.
        if mmvq && !(layer_mat && w.n_mat == 1) {
            continue;
        }
        let min_t = if mmvq { crate::options::GEMM_MIN_TOKENS } else { 1 };
        let used = match w.ty {
            _ if mmvq => DType::F16,
            quant::GgmlType::F16 => DType::F16,
            quant::GgmlType::BF16 => DType::BF16,
            _ => DType::F32,
        };
        for dtype in std::iter::once(used).chain(extra.iter().copied().filter(|&d| d != used)) {
            let s = Shape { dtype, n: w.rows, k: w.cols, min_t };
            match out.iter_mut().find(|o| o.dtype == s.dtype && o.n == s.n && o.k == s.k) {
                Some(o) => o.min_t = o.min_t.min(min_t),
                None => out.push(s),
            }
        }
    }
    out
}
