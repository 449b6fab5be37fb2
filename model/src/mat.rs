//! The weight type of every architecture: a [`Mat`] is a row-major matrix (or a stack of
//! `n_mat` equal matrices: routed experts) in any ggml block type, either a window into a
//! memory-mapped [`gguf::GgufFile`] (every shard of a split model; a multi-gigabyte model is
//! never copied) or owned (PLE rows read from the SSD, tests, synthetic layers). Its products
//! are the executors': the CPU's kernels read [`Mat::matrix`], a GPU executor uploads
//! [`Mat::data`].

use std::collections::HashMap;
use std::sync::Arc;

use gguf::GgufFile;
use quant::GgmlType;

use crate::ram::RamRegion;

/// Bytes [`Mat::read_into_ram`] copies between two calls of its callback.
const COPY_PIECE: usize = 8 << 20;

/// Where the bytes of a [`Mat`] live.
#[derive(Clone)]
enum Bytes {
    /// Owned, stored in u64 words so that F32 data is always 4-byte aligned.
    Owned { words: Vec<u64>, len: usize },
    /// `len` bytes at `start` of a region shared by the weights read into RAM together.
    Ram { region: Arc<RamRegion>, start: usize, len: usize },
    /// `len` bytes at `start` inside tensor number `tensor` of a mapped file.
    Mapped { file: Arc<GgufFile>, tensor: usize, start: usize, len: usize },
}

impl Bytes {
    /// A copy of `bytes` in u64 words.
    fn owned(bytes: &[u8]) -> Bytes {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_le_bytes(b);
        }
        Bytes::Owned { words, len: bytes.len() }
    }
}

/// A row-major weight matrix `[rows][cols]` (ggml ne = `[cols, rows]`), or `n_mat` of them
/// back to back (ggml ne = `[cols, rows, n_mat]`).
#[derive(Clone)]
pub struct Mat {
    pub ty: GgmlType,
    /// Output features (per matrix of a stack).
    pub rows: usize,
    /// Input features (row length).
    pub cols: usize,
    /// 1 for a plain matrix; the number of experts of a stack.
    pub n_mat: usize,
    row_bytes: usize,
    bytes: Bytes,
}

impl std::fmt::Debug for Mat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mat({} {}x{}", self.ty.name(), self.rows, self.cols)?;
        if self.n_mat > 1 {
            write!(f, " x{}", self.n_mat)?;
        }
        write!(f, ")")
    }
}

pub use crate::error::MatError;

fn geometry(ty: GgmlType, rows: usize, cols: usize, got: usize) -> Result<usize, MatError> {
    if !ty.has_reference() {
        return Err(MatError::Unsupported(ty));
    }
    let rb = ty.row_bytes(cols).ok_or(MatError::Ragged { ty, cols })?;
    let expected = rb.checked_mul(rows).ok_or(MatError::Size { ty, rows, cols, expected: usize::MAX, got })?;
    if expected != got {
        return Err(MatError::Size { ty, rows, cols, expected, got });
    }
    Ok(rb)
}

impl Mat {
    /// An owned F32 matrix from row-major values.
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Mat, MatError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Mat::from_raw(GgmlType::F32, rows, cols, &bytes)
    }

    /// An owned matrix from raw ggml bytes (`rows` rows of `ty.row_bytes(cols)` bytes).
    pub fn from_raw(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Mat, MatError> {
        let row_bytes = geometry(ty, rows, cols, bytes.len())?;
        Ok(Mat { ty, rows, cols, n_mat: 1, row_bytes, bytes: Bytes::owned(bytes) })
    }

    /// A window of `rows` rows starting at byte `start` of tensor `tensor` of `file`.
    pub(crate) fn mapped(
        file: &Arc<GgufFile>,
        tensor: usize,
        start: usize,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Mat, MatError> {
        Mat::mapped_stack(file, tensor, start, ty, rows, cols, 1)
    }

    /// [`Mat::mapped`] without the block check: for a table read by row whose reader checks
    /// each row it reads (the 29–51 GB PLE table, which a load-time pass would read whole).
    pub(crate) fn mapped_unchecked(
        file: &Arc<GgufFile>,
        tensor: usize,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Mat, MatError> {
        Mat::window(file, tensor, 0, ty, rows, cols, 1)
    }

    /// `n_mat` matrices of `rows` rows back to back from byte `start` of tensor `tensor`.
    /// Every block's scales are checked ([`quant::check_blocks`]): one strided pass over the
    /// window, about the machine's read rate, and it pages a mapped window in.
    pub(crate) fn mapped_stack(
        file: &Arc<GgufFile>,
        tensor: usize,
        start: usize,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n_mat: usize,
    ) -> Result<Mat, MatError> {
        let m = Mat::window(file, tensor, start, ty, rows, cols, n_mat)?;
        quant::check_blocks(ty, m.data()).map_err(|e| match e {
            // Counted from the tensor's first block, not the window's (an expert of a stack).
            quant::QuantError::BadBlock { bad, .. } => {
                let block = start / ty.type_size() + bad.block;
                MatError::BadBlock { ty, bad: quant::BadBlock { block, ..bad }, offset: block * ty.type_size() }
            }
            other => MatError::Quant(other),
        })?;
        Ok(m)
    }

    fn window(
        file: &Arc<GgufFile>,
        tensor: usize,
        start: usize,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n_mat: usize,
    ) -> Result<Mat, MatError> {
        let row_bytes = ty.row_bytes(cols).ok_or(MatError::Ragged { ty, cols })?;
        let all_rows =
            rows.checked_mul(n_mat).ok_or(MatError::Size { ty, rows, cols, expected: usize::MAX, got: 0 })?;
        let len = row_bytes.checked_mul(all_rows).ok_or(MatError::Size {
            ty,
            rows: all_rows,
            cols,
            expected: usize::MAX,
            got: 0,
        })?;
        let avail = file.tensors().get(tensor).map_or(0, |t| file.tensor_data(t).len().saturating_sub(start));
        if avail < len {
            return Err(MatError::Size { ty, rows: all_rows, cols, expected: len, got: avail });
        }
        geometry(ty, all_rows, cols, len)?;
        Ok(Mat { ty, rows, cols, n_mat, row_bytes, bytes: Bytes::Mapped { file: file.clone(), tensor, start, len } })
    }

    /// Whether the bytes are a window into a mapped file (not a copy in RAM).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped { .. })
    }

    /// Bytes the mapped matrices among `mats` hold, each window counted once (a tied output
    /// head and token embedding are one window): what [`Mat::read_into_ram`] copies.
    pub fn mapped_bytes(mats: &[&mut Mat]) -> u64 {
        unique_windows(mats).0.iter().map(|w| w.1 as u64).sum()
    }

    /// Copies the mapped matrices among `mats` into one [`RamRegion`] (2 MiB pages) and points
    /// them at the copy; matrices that share a window share its copy. `copied` is called with
    /// each piece of a source window once its bytes are in RAM (to give the mapped pages back, count
    /// progress). On an allocation error nothing changes.
    pub fn read_into_ram(mats: Vec<&mut Mat>, mut copied: impl FnMut(&[u8])) -> std::io::Result<()> {
        let (windows, index) = unique_windows(&mats);
        // In source order, windows that follow each other there (the experts of a stack) stay
        // back to back, so a stack is still one range a device can read ([`Mat::joined`]);
        // others start on 64 bytes: F32 rows stay aligned, no copy shares a cache line.
        let mut starts = Vec::with_capacity(windows.len());
        let mut at = 0usize;
        for (i, w) in windows.iter().enumerate() {
            let follows = i > 0 && windows[i - 1].0 + windows[i - 1].1 == w.0;
            let start = if follows { at } else { at.next_multiple_of(64) };
            starts.push(start);
            at = start + w.1;
        }
        let total = at;
        let mut region = RamRegion::new(total)?;
        for (w, &start) in windows.iter().zip(&starts) {
            // In pieces, so that a caller who gives each piece's mapped pages back never holds
            // a large window (a 178 MB output head) twice.
            for (i, src) in mats[w.2].data().chunks(COPY_PIECE).enumerate() {
                let at = start + i * COPY_PIECE;
                region.bytes_mut()[at..at + src.len()].copy_from_slice(src);
                copied(src);
            }
        }
        let region = Arc::new(region);
        for m in mats {
            if let Some(&i) = index.get(&(m.data().as_ptr() as usize, m.data().len())).filter(|_| m.is_mapped()) {
                m.bytes = Bytes::Ram { region: region.clone(), start: starts[i], len: windows[i].1 };
            }
        }
        Ok(())
    }

    /// The bytes of `mats` as one slice when each starts where the one before ends in the same
    /// backing (the experts of a stack split by the loader, mapped or read into RAM): what a
    /// device reads as a stack. None otherwise.
    pub fn joined<'a>(mats: &[&'a Mat]) -> Option<&'a [u8]> {
        let (first, last) = (mats.first()?, mats.last()?);
        for pair in mats.windows(2) {
            let follows = match (&pair[0].bytes, &pair[1].bytes) {
                (Bytes::Ram { region: a, start: s0, len: l0 }, Bytes::Ram { region: b, start: s1, .. }) => {
                    Arc::ptr_eq(a, b) && s0 + l0 == *s1
                }
                (
                    Bytes::Mapped { file: a, tensor: t0, start: s0, len: l0 },
                    Bytes::Mapped { file: b, tensor: t1, start: s1, .. },
                ) => Arc::ptr_eq(a, b) && t0 == t1 && s0 + l0 == *s1,
                _ => false,
            };
            if !follows {
                return None;
            }
        }
        match (&first.bytes, &last.bytes) {
            (Bytes::Ram { region, start, .. }, Bytes::Ram { start: s1, len: l1, .. }) => {
                Some(&region.bytes()[*start..s1 + l1])
            }
            (Bytes::Mapped { file, tensor, start, .. }, Bytes::Mapped { start: s1, len: l1, .. }) => {
                Some(&file.tensor_data(&file.tensors()[*tensor])[*start..s1 + l1])
            }
            _ if mats.len() == 1 => Some(first.data()),
            _ => None,
        }
    }

    /// All bytes of the matrix (of every matrix of a stack).
    pub fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Owned { words, len } => {
                // SAFETY: u64 -> u8 reinterpretation of an initialised Vec; u8 has no alignment
                // requirement and `len <= 8 * words.len()` by construction.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
            Bytes::Ram { region, start, len } => &region.bytes()[*start..*start + *len],
            Bytes::Mapped { file, tensor, start, len } => {
                &file.tensor_data(&file.tensors()[*tensor])[*start..*start + *len]
            }
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Bytes of row `r` (rows of a stack count on across its matrices).
    pub fn row_data(&self, r: usize) -> &[u8] {
        &self.data()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Dequantizes row `r` into `out[..cols]` (exact, like ggml's get_rows).
    pub fn get_row(&self, r: usize, out: &mut [f32]) {
        if quant::dequantize_row(self.ty, self.row_data(r), &mut out[..self.cols]).is_err() {
            out[..self.cols].fill(f32::NAN); // unreachable: geometry validated at construction
        }
    }
}

/// The distinct mapped windows among `mats`, in order of first use: (address, length, index
/// of the first matrix), and each window's number by (address, length).
fn unique_windows(mats: &[&mut Mat]) -> (Vec<(usize, usize, usize)>, HashMap<(usize, usize), usize>) {
    let (mut out, mut index) = (Vec::new(), HashMap::new());
    let mut order: Vec<usize> = (0..mats.len()).filter(|&i| mats[i].is_mapped()).collect();
    order.sort_by_key(|&i| mats[i].data().as_ptr() as usize);
    for i in order {
        let m = &mats[i];
        let w = (m.data().as_ptr() as usize, m.data().len());
        index.entry(w).or_insert_with(|| {
            out.push((w.0, w.1, i));
            out.len() - 1
        });
    }
    (out, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window that starts inside a tensor (an expert of a stack) names the bad block by its
    /// index in the tensor, not in the window.
    #[test]
    fn a_bad_block_in_a_window_counts_from_the_tensor_start() {
        let (rows, cols) = (4usize, 64usize);
        let rb = GgmlType::Q8_0.row_bytes(cols).unwrap(); // 2 blocks of 34 bytes
        let mut bytes = vec![0u8; rb * rows];
        bytes[34 * 5..34 * 5 + 2].copy_from_slice(&0x7c01u16.to_le_bytes()); // NaN in block 5
        let mut w = gguf::GgufWriter::new();
        w.add_metadata("general.architecture", gguf::Value::Str("llama".into()));
        w.add_tensor("experts", &[cols as u64, 2, 2], GgmlType::Q8_0, bytes);
        let file = Arc::new(GgufFile::from_bytes("t.gguf", w.to_bytes().unwrap()).unwrap());
        assert!(Mat::mapped(&file, 0, 0, GgmlType::Q8_0, 2, cols).is_ok(), "first expert is fine");
        let e = Mat::mapped(&file, 0, 2 * rb, GgmlType::Q8_0, 2, cols).unwrap_err();
        let bad = quant::BadBlock { block: 5, field: "d", why: quant::BadScale::NaN };
        assert_eq!(e, MatError::BadBlock { ty: GgmlType::Q8_0, bad, offset: 170 });
        assert!(Mat::mapped_unchecked(&file, 0, GgmlType::Q8_0, 4, cols).is_ok(), "rows checked when read");
    }
}
