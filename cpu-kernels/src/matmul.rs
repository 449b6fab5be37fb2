//! Public matvec / matmul / get_row entry points: shape checks, activation preparation, kernel
//! selection and the rayon split over row chunks.

use crate::acts::Acts;
use crate::prepare;
use crate::tensor::{Gemm, KernelError, Path, QTensor, RowsFn, best_path, kernel_supported};

/// Output pointer shared by the row-chunk tasks; each task writes disjoint rows.
#[derive(Clone, Copy)]
struct YPtr(*mut f32);
// SAFETY: tasks write disjoint (row, column) cells of the buffer this points into, which
// outlives the parallel loop (it is borrowed mutably by the caller for its whole duration).
unsafe impl Send for YPtr {}
// SAFETY: see Send; the pointer itself is never mutated.
unsafe impl Sync for YPtr {}

fn select(path: Path, ty: quant::GgmlType) -> Result<RowsFn, KernelError> {
    if !path.available() {
        return Err(KernelError::PathUnavailable(path));
    }
    match path {
        Path::Portable => Ok(crate::portable::rows),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => crate::x86::avx2_kernel(ty).ok_or(KernelError::Unsupported(ty)),
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => crate::x86::avx512_kernel(ty).ok_or(KernelError::Unsupported(ty)),
        #[cfg(not(target_arch = "x86_64"))]
        _ => Err(KernelError::PathUnavailable(path)),
    }
}

/// `y[rows] = W x` with an explicit kernel path.
pub fn try_matvec_with(path: Path, w: &QTensor, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
    try_matmul_with(path, w, x, 1, y)
}

/// `y[n][rows] = x[n][cols] · Wᵀ` with an explicit kernel path.
pub fn try_matmul_with(path: Path, w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
    try_matmul_gemm(path, Gemm::Lanes, w, x, n, y)
}

/// [`try_matmul_with`] with the prompt products' block summation chosen ([`Gemm`]).
pub fn try_matmul_gemm(
    path: Path,
    gemm: Gemm,
    w: &QTensor,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    let rb = w.validate()?;
    if x.len() < n * w.cols {
        return Err(KernelError::Shape { what: "activations x (n * cols)", expected: n * w.cols, got: x.len() });
    }
    if y.len() < n * w.rows {
        return Err(KernelError::Shape { what: "output y (n * rows)", expected: n * w.rows, got: y.len() });
    }
    if n == 0 || w.rows == 0 {
        return Ok(());
    }
    let kernel = fast_kernel(path, w.ty, n)?;
    let acts = if small_batch_ggml(path, w.ty, n) {
        prepare::acts_ggml(w.ty, x, n, w.cols, path)?
    } else {
        prepare::acts(w.ty, x, n, w.cols, path, gemm)?
    };
    run(kernel, w, rb, &acts, y);
    Ok(())
}

/// Activations quantized once for several weight matrices of the same type and row length
/// (e.g. Q/K/V or gate/up projections of the same hidden state). Made by [`prepare_acts`].
pub struct PreparedActs {
    acts: Acts,
    wty: quant::GgmlType,
    cols: usize,
    /// The kernel the products run (the one the unprepared entry point would pick).
    kernel: RowsFn,
}

/// Which entry point's products [`prepare_acts_as`] prepares for (their bits are its bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActsFor {
    /// [`try_matmul`].
    Fast,
    /// [`try_matmul_ggml`] (llama.cpp's order).
    Ggml,
}

impl PreparedActs {
    /// Number of activation columns.
    pub fn n(&self) -> usize {
        self.acts.n
    }
}

/// Quantize `x = [n][cols]` for weights of type `wty` on the best path.
pub fn prepare_acts(wty: quant::GgmlType, x: &[f32], n: usize, cols: usize) -> Result<PreparedActs, KernelError> {
    prepare_acts_with(best_path(), wty, x, n, cols)
}

/// [`prepare_acts`] for an explicit path.
pub fn prepare_acts_with(
    path: Path,
    wty: quant::GgmlType,
    x: &[f32],
    n: usize,
    cols: usize,
) -> Result<PreparedActs, KernelError> {
    if !kernel_supported(wty) {
        return Err(KernelError::Unsupported(wty));
    }
    if !path.available() {
        return Err(KernelError::PathUnavailable(path));
    }
    if x.len() < n * cols {
        return Err(KernelError::Shape { what: "activations x (n * cols)", expected: n * cols, got: x.len() });
    }
    Ok(PreparedActs { acts: prepare::acts(wty, x, n, cols, path, Gemm::Lanes)?, wty, cols, kernel: select(path, wty)? })
}

/// Activations `x = [n][cols]` quantized once for several matrices of type `wty` (the experts
/// a token chose), exactly as `entry`'s products of `n` columns prepare and run them: the
/// products from [`try_matmul_prepared`] equal [`try_matmul`]'s or [`try_matmul_ggml`]'s bit
/// for bit.
pub fn prepare_acts_as(
    entry: ActsFor,
    wty: quant::GgmlType,
    x: &[f32],
    n: usize,
    cols: usize,
) -> Result<PreparedActs, KernelError> {
    let path = best_path();
    if !kernel_supported(wty) {
        return Err(KernelError::Unsupported(wty));
    }
    if x.len() < n * cols {
        return Err(KernelError::Shape { what: "activations x (n * cols)", expected: n * cols, got: x.len() });
    }
    #[cfg(target_arch = "x86_64")]
    if entry == ActsFor::Ggml {
        // As try_matmul_ggml_with: llama.cpp's kernels unless its tiled GEMM would run.
        let tiled = n >= 8 && matches!(wty, quant::GgmlType::Q4K | quant::GgmlType::Q6K);
        if let Some(kernel) = crate::x86::ggml_kernel(path, wty).filter(|_| !tiled) {
            return Ok(PreparedActs { acts: prepare::acts_ggml(wty, x, n, cols, path)?, wty, cols, kernel });
        }
    }
    let _ = entry;
    // As try_matmul_gemm with Gemm::Lanes.
    let acts = if small_batch_ggml(path, wty, n) {
        prepare::acts_ggml(wty, x, n, cols, path)?
    } else {
        prepare::acts(wty, x, n, cols, path, Gemm::Lanes)?
    };
    Ok(PreparedActs { acts, wty, cols, kernel: fast_kernel(path, wty, n)? })
}

/// `y[n][rows] = x · Wᵀ` with activations from [`prepare_acts`]; `w.ty` and `w.cols` must be
/// the ones the activations were prepared for.
pub fn try_matmul_prepared(w: &QTensor, acts: &PreparedActs, y: &mut [f32]) -> Result<(), KernelError> {
    let rb = w.validate()?;
    if w.ty != acts.wty {
        return Err(KernelError::Shape {
            what: "prepared activations weight type (GgmlType as u32)",
            expected: acts.wty as usize,
            got: w.ty as usize,
        });
    }
    if w.cols != acts.cols {
        return Err(KernelError::Shape { what: "prepared activations cols", expected: acts.cols, got: w.cols });
    }
    let n = acts.acts.n;
    if y.len() < n * w.rows {
        return Err(KernelError::Shape { what: "output y (n * rows)", expected: n * w.rows, got: y.len() });
    }
    if n == 0 || w.rows == 0 {
        return Ok(());
    }
    run(acts.kernel, w, rb, &acts.acts, y);
    Ok(())
}

/// Prompt-sized products and activations prepared for the row tiles (`x86::gemm_q0`,
/// `x86::gemv_tiles`) run tiles of 16 rows: task row ranges are rounded up to whole tiles so no
/// task ends in a partly filled one.
fn align_rows(chunk: usize, n: usize, tiles: bool) -> usize {
    if n >= 16 || tiles { chunk.next_multiple_of(16) } else { chunk }
}

/// Split the rows of `w` over rayon and run `kernel` (y already checked to hold n * rows).
fn run(kernel: RowsFn, w: &QTensor, rb: usize, acts: &Acts, y: &mut [f32]) {
    let n = acts.n;
    let rows = w.rows;
    let yp = YPtr(y.as_mut_ptr());
    let threads = rayon::current_num_threads().max(1);
    // Work below ~256 KiB of weight traffic is not worth waking the pool.
    let serial = threads == 1 || rows * rb * n.min(8) < (256 << 10);
    if serial {
        // SAFETY: single task covering all rows; the callers checked y holds n * rows values
        // and `select` verified the CPU features.
        unsafe { kernel(w, rb, acts, 0, rows, yp.0) };
        return;
    }
    // ~8 chunks per thread balances the shared-VM noise; at least 16 rows (4 for matmul) per
    // task keeps the per-task overhead small against the row work.
    // Each task also gets >= 64 KiB of weight traffic (x n columns) so that small decode-time
    // matrices are split into a few tasks, not dozens of tiny ones.
    let min_rows = if n == 1 { 16 } else { 4 };
    let min_bytes_rows = (64usize << 10).div_ceil(rb * n.min(8));
    let chunk = align_rows(rows.div_ceil(threads * 8).max(min_rows).max(min_bytes_rows), n, acts.tiles);
    let n_chunks = rows.div_ceil(chunk);
    crate::team::for_each(n_chunks, |i| {
        let r0 = i * chunk;
        let r1 = (r0 + chunk).min(rows);
        // Capture the whole Send wrapper, not its raw-pointer field (edition-2021 closures
        // capture disjoint fields, and `*mut f32` alone is not Send).
        #[allow(clippy::redundant_locals)]
        let yp = yp;
        // SAFETY: chunks are disjoint row ranges, so tasks write disjoint cells of y.
        unsafe { kernel(w, rb, acts, r0, r1, yp.0) };
    });
}

/// `y[n][rows] = x · Wᵀ` computed in exactly the float order of llama.cpp's x86 CPU backend
/// (commit 0c1e570 on an AVX2/AVX-512 machine, batches of < 8 rows): Q8_0/Q5_0 with x86-rounded
/// Q8_0 activations and ggml's lane layout, Q4_K like the repacked 8x8 GEMV (1 row) / GEMM
/// (groups of 4 rows), Q6_K like `ggml_vec_dot_q6_K_q8_K` (AVX2). Other types use the fast
/// kernels. Slower than [`matmul`]; for models whose logits are so sensitive to the last bit
/// that matching llama.cpp token for token needs it (Gemma 3). Every [`Path`] gives identical
/// bits (tests/ggml_order.rs); the best available one runs.
pub fn try_matmul_ggml(w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
    try_matmul_ggml_with(best_path(), w, x, n, y)
}

/// [`try_matmul_ggml`] on an explicit path (tests, benchmarks).
pub fn try_matmul_ggml_with(path: Path, w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
    if !path.available() {
        return Err(KernelError::PathUnavailable(path));
    }
    // From 8 rows on, llama.cpp runs K-quants through its tiled GEMM, whose order we do not
    // copy: there the fast kernels are as close and much quicker.
    let tiled = n >= 8 && matches!(w.ty, quant::GgmlType::Q4K | quant::GgmlType::Q6K);
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = crate::x86::ggml_kernel(path, w.ty).filter(|_| !tiled) {
        let rb = w.validate()?;
        if x.len() < n * w.cols {
            return Err(KernelError::Shape { what: "activations x (n * cols)", expected: n * w.cols, got: x.len() });
        }
        if y.len() < n * w.rows {
            return Err(KernelError::Shape { what: "output y (n * rows)", expected: n * w.rows, got: y.len() });
        }
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        let acts = prepare::acts_ggml(w.ty, x, n, w.cols, path)?;
        run(kernel, w, rb, &acts, y);
        return Ok(());
    }
    try_matmul_with(path, w, x, n, y)
}

/// Several [`try_matmul_ggml`] products of the same activations `x = [n][cols]` (e.g. the
/// Q/K/V or gate/up projections) in one parallel region: activations are quantized once per
/// weight type and the rows of all matrices are split over rayon together, so decode pays one
/// fork/join instead of one per matrix. Results are identical to separate calls.
pub fn try_matmul_ggml_multi(ws: &[QTensor], x: &[f32], n: usize, ys: &mut [&mut [f32]]) -> Result<(), KernelError> {
    let path = best_path();
    if ws.len() != ys.len() {
        return Err(KernelError::Shape { what: "outputs (one per matrix)", expected: ws.len(), got: ys.len() });
    }
    #[cfg(target_arch = "x86_64")]
    let kernels: Option<Vec<RowsFn>> =
        if n < 8 || ws.iter().all(|w| !matches!(w.ty, quant::GgmlType::Q4K | quant::GgmlType::Q6K)) {
            ws.iter().map(|w| crate::x86::ggml_kernel(path, w.ty)).collect()
        } else {
            None
        };
    #[cfg(not(target_arch = "x86_64"))]
    let kernels: Option<Vec<RowsFn>> = None;
    let Some(kernels) = kernels.filter(|_| n > 0) else {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            try_matmul_ggml_with(path, w, x, n, y)?;
        }
        return Ok(());
    };
    multi_region(ws, x, n, ys, &kernels, |w| prepare::acts_ggml(w.ty, x, n, w.cols, path))
}

/// Several [`matmul`] products of the same activations `x = [n][cols]` (Q/K/V, gate/up) in
/// one parallel region, with the fast kernels: activations quantized once per (weight type,
/// cols), the rows of all matrices split over the threads together. Results are identical to
/// separate [`try_matmul`] calls.
pub fn try_matmul_multi(ws: &[QTensor], x: &[f32], n: usize, ys: &mut [&mut [f32]]) -> Result<(), KernelError> {
    try_matmul_multi_gemm(Gemm::Lanes, ws, x, n, ys)
}

/// [`try_matmul_multi`] with the prompt products' block summation chosen ([`Gemm`]).
pub fn try_matmul_multi_gemm(
    gemm: Gemm,
    ws: &[QTensor],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    let path = best_path();
    if ws.len() != ys.len() {
        return Err(KernelError::Shape { what: "outputs (one per matrix)", expected: ws.len(), got: ys.len() });
    }
    if n == 0 {
        return Ok(());
    }
    let kernels = ws.iter().map(|w| fast_kernel(path, w.ty, n)).collect::<Result<Vec<_>, _>>()?;
    multi_region(ws, x, n, ys, &kernels, |w| {
        if small_batch_ggml(path, w.ty, n) {
            prepare::acts_ggml(w.ty, x, n, w.cols, path)
        } else {
            prepare::acts(w.ty, x, n, w.cols, path, gemm)
        }
    })
}

/// Fewer columns than the prompt tiles' minimum of Q8_0 / Q5_0 weights on AVX-512 (decode and
/// speculative windows) run the llama.cpp-order kernels (`ggml_q8_512`, one row per ymm for one
/// column): faster there than the pair kernels (the one-column Q5_0 decode is ~1.5x) and the
/// same bits for every such batch size, so a verified window equals one-token steps.
fn small_batch_ggml(path: Path, ty: quant::GgmlType, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        path == Path::Avx512
            && n < crate::x86::gemm_q0::MIN_COLS
            && matches!(ty, quant::GgmlType::Q8_0 | quant::GgmlType::Q5_0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, ty, n);
        false
    }
}

/// The kernel of the fast products for `n` columns of `ty` weights on `path`.
fn fast_kernel(path: Path, ty: quant::GgmlType, n: usize) -> Result<RowsFn, KernelError> {
    #[cfg(target_arch = "x86_64")]
    if small_batch_ggml(path, ty, n)
        && let Some(k) = crate::x86::ggml_kernel(path, ty)
    {
        return Ok(k);
    }
    select(path, ty)
}

/// The shared body of the `*_multi` products: checks, one [`Acts`] per distinct (type, cols)
/// from `prep`, then `(matrix, r0, r1)` tasks of roughly equal weight traffic in one region.
fn multi_region(
    ws: &[QTensor],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    kernels: &[RowsFn],
    prep: impl Fn(&QTensor) -> Result<Acts, KernelError>,
) -> Result<(), KernelError> {
    let mut rbs = Vec::with_capacity(ws.len());
    for (w, y) in ws.iter().zip(ys.iter()) {
        rbs.push(w.validate()?);
        if x.len() < n * w.cols {
            return Err(KernelError::Shape { what: "activations x (n * cols)", expected: n * w.cols, got: x.len() });
        }
        if y.len() < n * w.rows {
            return Err(KernelError::Shape { what: "output y (n * rows)", expected: n * w.rows, got: y.len() });
        }
    }
    // One activation preparation per distinct (weight type, cols).
    let mut acts: Vec<(quant::GgmlType, usize, Acts)> = Vec::new();
    for w in ws {
        if !acts.iter().any(|(t, c, _)| *t == w.ty && *c == w.cols) {
            acts.push((w.ty, w.cols, prep(w)?));
        }
    }
    let act_of = |w: &QTensor| &acts.iter().find(|(t, c, _)| *t == w.ty && *c == w.cols).expect("prepared above").2;
    let threads = rayon::current_num_threads().max(1);
    let total: usize = ws.iter().zip(&rbs).map(|(w, rb)| w.rows * rb).sum();
    // (matrix, r0, r1) tasks of roughly equal weight traffic.
    let target = (total / (threads * 8)).max(64 << 10);
    let mut tasks = Vec::new();
    for (i, (w, &rb)) in ws.iter().zip(&rbs).enumerate() {
        let chunk = align_rows((target / rb).max(if n == 1 { 16 } else { 4 }), n, act_of(w).tiles).min(w.rows.max(1));
        let mut r0 = 0;
        while r0 < w.rows {
            tasks.push((i, r0, (r0 + chunk).min(w.rows)));
            r0 += chunk;
        }
    }
    let yps: Vec<YPtr> = ys.iter_mut().map(|y| YPtr(y.as_mut_ptr())).collect();
    let one = |&(i, r0, r1): &(usize, usize, usize)| {
        let yp = yps[i];
        // SAFETY: tasks cover disjoint row ranges of their matrix, outputs were checked to hold
        // n * rows values and the kernels' CPU features are those of `path` (available).
        unsafe { kernels[i](&ws[i], rbs[i], act_of(&ws[i]), r0, r1, yp.0) };
    };
    if threads == 1 || total * n.min(8) < (256 << 10) || tasks.len() == 1 {
        tasks.iter().for_each(one);
    } else {
        crate::team::for_each(tasks.len(), |t| one(&tasks[t]));
    }
    Ok(())
}

/// [`try_matmul_ggml`], panicking on bad shapes like [`matmul`].
pub fn matmul_ggml(w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) {
    if let Err(e) = try_matmul_ggml(w, x, n, y) {
        panic!("matmul_ggml {:?} {}x{} n={n}: {e}", w.ty, w.rows, w.cols);
    }
}

/// [`matvec`] returning errors instead of panicking.
pub fn try_matvec(w: &QTensor, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
    try_matmul_with(best_path(), w, x, 1, y)
}

/// [`matmul`] returning errors instead of panicking.
pub fn try_matmul(w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
    try_matmul_with(best_path(), w, x, n, y)
}

/// `y[rows] = W x`; x is quantized to `w.ty.vec_dot_type()` internally.
/// Panics with the [`KernelError`] message on a shape mismatch (use [`try_matvec`] otherwise).
pub fn matvec(w: &QTensor, x: &[f32], y: &mut [f32]) {
    if let Err(e) = try_matvec(w, x, y) {
        panic!("matvec {:?} {}x{}: {e}", w.ty, w.rows, w.cols);
    }
}

/// `y[n][rows] = x[n][cols] · Wᵀ` (n activation columns, e.g. prompt tokens).
/// Panics with the [`KernelError`] message on a shape mismatch (use [`try_matmul`] otherwise).
pub fn matmul(w: &QTensor, x: &[f32], n: usize, y: &mut [f32]) {
    if let Err(e) = try_matmul(w, x, n, y) {
        panic!("matmul {:?} {}x{} n={n}: {e}", w.ty, w.rows, w.cols);
    }
}

/// Dequantize row `row` of `w` into `out[..cols]`.
pub fn try_get_row(w: &QTensor, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
    let rb = w.row_bytes()?;
    if row >= w.rows {
        return Err(KernelError::Shape { what: "get_row row index (< rows)", expected: w.rows, got: row });
    }
    if out.len() < w.cols {
        return Err(KernelError::Shape { what: "get_row out length", expected: w.cols, got: out.len() });
    }
    let src = w.data.get(row * rb..(row + 1) * rb).ok_or(KernelError::Shape {
        what: "weight data bytes",
        expected: (row + 1) * rb,
        got: w.data.len(),
    })?;
    quant::dequantize_row(w.ty, src, &mut out[..w.cols])?;
    Ok(())
}

/// Dequantize one row (embedding lookup). Panics on a bad row index or shape.
pub fn get_row(w: &QTensor, row: usize, out: &mut [f32]) {
    if let Err(e) = try_get_row(w, row, out) {
        panic!("get_row {:?} {}x{} row {row}: {e}", w.ty, w.rows, w.cols);
    }
}

// Beside the dispatcher that picks those kernels (and not in `tensor`, which the kernels import).
impl Gemm {
    /// Whether [`Gemm::Tiles`] changes the kernels of an `n`-column product of `ty` weights
    /// (on the best path of this CPU).
    pub fn tiles_apply(ty: quant::GgmlType, n: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            (n >= crate::x86::gemm_q0::MIN_COLS
                && matches!(
                    ty,
                    quant::GgmlType::Q8_0
                        | quant::GgmlType::Q5_0
                        | quant::GgmlType::Q4_0
                        | quant::GgmlType::IQ4NL
                        | quant::GgmlType::Q4_1
                        | quant::GgmlType::Q4K
                        | quant::GgmlType::Q6K
                )
                || crate::x86::gemv_tiles::has(ty))
                && best_path() == Path::Avx512
                && crate::x86::cpu::has_avx512_zmm()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (ty, n);
            false
        }
    }
}
