//! The portable path: `quant`'s scalar reference `vec_dot`, one row × one column at a time.
//! It is the correctness baseline on any CPU and what runs when no SIMD path is available.

use crate::acts::Acts;
use crate::tensor::QTensor;

/// See [`crate::tensor::RowsFn`].
///
/// # Safety
/// Same contract as `RowsFn`: `y` valid for `a.n * w.rows` writes, rows disjoint per task.
pub(crate) unsafe fn rows(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
    for r in r0..r1 {
        let wr = &w.data[r * rb..(r + 1) * rb];
        for c in 0..a.n {
            let act = &a.raw[c * a.raw_row..(c + 1) * a.raw_row];
            // Shapes were validated by the caller, so vec_dot cannot fail; NaN marks a bug loudly.
            let v = quant::vec_dot(w.ty, w.cols, wr, act).unwrap_or(f32::NAN);
            // SAFETY: c < n and r < rows, inside the n * rows buffer; this task owns row r.
            unsafe { *y.add(c * w.rows + r) = v };
        }
    }
}
