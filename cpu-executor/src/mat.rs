//! The CPU executor's view of the `model` crate's [`Mat`] (which knows no backend): its
//! matrices as `cpu_kernels` operands, and `W x` products in llama.cpp's x86 float order (the
//! shared decoders' exact path), with every output element the same function of its row and
//! token for any batch size.

use quant::GgmlType;

use model::Mat;

/// The CPU executor's methods on [`Mat`] (a type of the `model` crate, which knows no backend).
pub trait MatCpu {
    /// `y[rows] = W x`.
    fn matvec(&self, x: &[f32], y: &mut [f32]);

    /// `y[n][rows] = x[n][cols] Wᵀ`, through the CPU executor's kernels: llama.cpp's x86 float
    /// order (`cpu_kernels::matmul_ggml`, as the shared decoders' exact path), and the
    /// reference order (`cpu::matmul_ordered`) for types without such a kernel. Every output
    /// element is the same function of its weight row and token whatever `n` is, so a batched
    /// pass is bit-identical to token-by-token passes: llama.cpp orders K-quant products of
    /// several tokens (its 4-row GEMM, its tiled GEMM from 8) unlike one token's (its GEMV),
    /// so those run one token at a time.
    fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]);

    /// Matrix `e` of a stack (0 for a plain matrix) as a `cpu_kernels` operand.
    fn matrix(&self, e: usize) -> cpu_kernels::QTensor<'_>;

    /// A plain matrix as a `cpu_kernels` operand ([`MatCpu::matrix`] 0).
    fn qt(&self) -> cpu_kernels::QTensor<'_> {
        self.matrix(0)
    }
}

impl MatCpu for Mat {
    fn matrix(&self, e: usize) -> cpu_kernels::QTensor<'_> {
        debug_assert!(e < self.n_mat, "{self:?}: matrix {e}");
        let per = self.rows * self.row_bytes();
        cpu_kernels::QTensor {
            ty: self.ty,
            data: &self.data()[e * per..(e + 1) * per],
            rows: self.rows,
            cols: self.cols,
        }
    }

    fn matvec(&self, x: &[f32], y: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        self.matmul(x, 1, y);
    }

    fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let (x, y) = (&x[..n * cols], &mut y[..n * rows]);
        let w = self.qt();
        let per_token = matches!(self.ty, GgmlType::Q4K | GgmlType::Q6K) && n > 1;
        if !cpu_kernels::SUPPORTED_TYPES.contains(&self.ty) {
            if let Err(e) = crate::matmul_ordered(&w, x, n, y) {
                y.fill(f32::NAN); // unreachable: the geometry was validated at construction
                debug_assert!(false, "{self:?}: {e}");
            }
        } else if per_token {
            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                cpu_kernels::matmul_ggml(&w, xt, 1, yt);
            }
        } else {
            cpu_kernels::matmul_ggml(&w, x, n, y);
        }
    }
}
