//! Where the PLE n-gram table rows come from: the release table is 29–51 GB and lives in its
//! own GGUF shard on an SSD, so it is read by row, never as a whole matrix.
//!
//! Three sources ([`PleIo`]):
//! - `Direct`: `O_DIRECT` reads of the 4096-aligned span around each row into an aligned
//!   buffer, the row copied out. The page cache is never filled with table pages (the shard is
//!   still mapped by the GGUF reader, but no page of the table is touched through the mapping).
//!   If the file system refuses `O_DIRECT` (older tmpfs, some FUSE mounts; at open or at the
//!   first read), the table falls back to buffered `pread`s and records a warning.
//! - `Mmap`: rows are read through the GGUF memory map (the kernel pages them in and keeps them).
//!   A mapping read past the end of a file that was truncated after it was mapped is a SIGBUS,
//!   which would kill the process, so before each row is read through the mapping the table
//!   file's current length is checked (`fstat` on a descriptor opened at load, one call per row
//!   not in the cache): a row past the end is an error naming the file, the row, its offset and
//!   the file's length, as a short read is in `Direct` mode. What remains is a race: a
//!   truncation between that check and the read of the row (a copy of `row_bytes` bytes right
//!   after it) still faults. See [`PleTable::get_row`].
//! - `Ram`: the whole table is copied into memory at load.
//!
//! In front of every source sits a row cache ([`RowCache`], CLOCK replacement, capacity in
//! bytes of raw rows): n-gram rows of frequent contexts repeat, and a hit saves an SSD read.
//! The cache stores the rows' raw (quantized) bytes, so cached and uncached rows dequantize
//! identically and every mode gives bit-identical logits.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use quant::GgmlType;

use crate::Mat;

/// How PLE table rows are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PleIo {
    /// `O_DIRECT` aligned reads (page cache stays free); buffered fallback with a warning.
    Direct,
    /// Through the GGUF memory map.
    #[default]
    Mmap,
    /// The whole table loaded into memory at start.
    Ram,
}

/// Runs `f(i)` for every `i < n`, possibly in parallel: how a batch of PLE rows not in the
/// cache is read from a file ([`PleTable::get_rows`]). `model` knows no backend, so the
/// executor passes its own loop (the CPU's: its thread team, `cpu_kernels::team::for_each`);
/// [`serial`] reads one row at a time.
pub type ParFor = fn(n: usize, f: &(dyn Fn(usize) + Sync));

/// The [`ParFor`] that runs `f(0)`, `f(1)`, … in order on the calling thread.
pub fn serial(n: usize, f: &(dyn Fn(usize) + Sync)) {
    (0..n).for_each(f)
}

/// PLE loading options (what `--ple-gguf`, `--ple-io`, `--ple-cache`, `--ple-skip` set).
#[derive(Clone, Debug)]
pub struct PleOptions {
    /// GGUF file holding `per_layer_token_embd.weight`. `None`: look in the model itself (its
    /// split siblings included).
    pub ple_gguf: Option<PathBuf>,
    pub ple_io: PleIo,
    /// Row cache capacity in bytes of raw table rows (0 = no cache).
    pub ple_cache_bytes: usize,
    /// Run without the table if it is not found: the PLE block is skipped (adds nothing) and a
    /// warning is recorded. Outputs then differ from the real model.
    pub ple_skip: bool,
    /// Test hook: behave as if the file system refused `O_DIRECT` at open.
    #[doc(hidden)]
    pub simulate_direct_refusal: bool,
}

impl Default for PleOptions {
    fn default() -> PleOptions {
        PleOptions {
            ple_gguf: None,
            ple_io: PleIo::Mmap,
            ple_cache_bytes: 64 << 20,
            ple_skip: false,
            simulate_direct_refusal: false,
        }
    }
}

/// Counters of the row cache and the reads behind it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PleCacheStats {
    /// Row lookups served from the cache.
    pub hits: u64,
    /// Row lookups that went to the source (mapping, RAM copy or file).
    pub misses: u64,
    /// Rows dropped to make room.
    pub evictions: u64,
    /// Rows the cache can hold.
    pub capacity_rows: usize,
    /// Rows currently held.
    pub resident_rows: usize,
    /// `pread` calls (Direct/buffered file source only).
    pub file_reads: u64,
    /// Bytes those reads transferred (aligned spans for O_DIRECT).
    pub file_bytes: u64,
}

/// A CLOCK (second-chance) cache of raw rows of equal length.
#[derive(Debug)]
pub struct RowCache {
    row_bytes: usize,
    cap: usize,
    data: Vec<u8>,
    owner: Vec<u64>,
    referenced: Vec<bool>,
    map: HashMap<u64, usize>,
    hand: usize,
    evictions: u64,
}

impl RowCache {
    pub fn new(row_bytes: usize, capacity_rows: usize) -> RowCache {
        RowCache {
            row_bytes,
            cap: capacity_rows,
            data: Vec::new(),
            owner: Vec::new(),
            referenced: Vec::new(),
            map: HashMap::new(),
            hand: 0,
            evictions: 0,
        }
    }

    pub fn capacity_rows(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `row` is cached (does not count as a use).
    pub fn contains(&self, row: u64) -> bool {
        self.map.contains_key(&row)
    }

    /// The cached bytes of `row`, marking it recently used.
    pub fn get(&mut self, row: u64) -> Option<&[u8]> {
        let &slot = self.map.get(&row)?;
        self.referenced[slot] = true;
        Some(&self.data[slot * self.row_bytes..(slot + 1) * self.row_bytes])
    }

    /// Stores `bytes` for `row` (which must not be cached), evicting a row not used since the
    /// hand last passed it.
    pub fn insert(&mut self, row: u64, bytes: &[u8]) {
        if self.cap == 0 || bytes.len() != self.row_bytes {
            return;
        }
        let slot = if self.owner.len() < self.cap {
            self.owner.push(row);
            self.referenced.push(false);
            self.data.extend_from_slice(bytes);
            self.owner.len() - 1
        } else {
            while self.referenced[self.hand] {
                self.referenced[self.hand] = false;
                self.hand = (self.hand + 1) % self.cap;
            }
            let s = self.hand;
            self.hand = (self.hand + 1) % self.cap;
            self.map.remove(&self.owner[s]);
            self.evictions += 1;
            self.owner[s] = row;
            self.referenced[s] = false;
            self.data[s * self.row_bytes..(s + 1) * self.row_bytes].copy_from_slice(bytes);
            s
        };
        self.map.insert(row, slot);
    }
}

const ALIGN: u64 = 4096;

#[cfg(target_arch = "aarch64")]
const O_DIRECT: i32 = 0o200000;
#[cfg(not(target_arch = "aarch64"))]
const O_DIRECT: i32 = 0o40000;
const EINVAL: i32 = 22;

enum Source {
    /// An owned copy (`Ram`), a test's matrix, or a table of a GGUF built in memory: nothing
    /// that a truncated file could take away.
    Mat(Mat),
    /// A window of the GGUF mapping of `path` (`Mmap`), the table at byte `base` of the file.
    /// `file` is the same file opened at load; its length is checked before a row is read
    /// through the mapping (a read past the end of a truncated file would be a SIGBUS).
    Mapped { mat: Mat, path: PathBuf, base: u64, file: File },
    /// Rows read from `path` at `base + row · row_bytes`.
    File { path: PathBuf, base: u64 },
}

struct Inner {
    cache: RowCache,
    hits: u64,
    misses: u64,
    file_reads: u64,
    file_bytes: u64,
    /// The open file and whether it is in O_DIRECT mode.
    file: Option<(File, bool)>,
    row: Vec<u8>,
}

/// The PLE table `[rows][cols]` (`cols` = PLE head dim) with its row source and cache.
pub struct PleTable {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// The mode actually in use.
    pub io: PleIo,
    source: Source,
    inner: Mutex<Inner>,
    warnings: Mutex<Vec<String>>,
}

impl std::fmt::Debug for PleTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PleTable({} {}x{}, {:?}, direct {})",
            self.ty.name(),
            self.rows,
            self.cols,
            self.io,
            self.direct_active()
        )
    }
}

fn open_file(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(O_DIRECT);
    }
    o.open(path)
}

impl From<Mat> for PleTable {
    /// A table over an existing matrix (tests, synthetic layers), read like `Mmap`, no cache.
    fn from(m: Mat) -> PleTable {
        let (ty, rows, cols) = (m.ty, m.rows, m.cols);
        PleTable::build(Source::Mat(m), ty, rows, cols, PleIo::Mmap, 0, None)
    }
}

impl PleTable {
    fn build(
        source: Source,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        io: PleIo,
        cache_bytes: usize,
        file: Option<(File, bool)>,
    ) -> PleTable {
        let row_bytes = ty.row_bytes(cols).unwrap_or(0);
        let cap = cache_bytes.checked_div(row_bytes).unwrap_or(0);
        PleTable {
            ty,
            rows,
            cols,
            row_bytes,
            io,
            source,
            inner: Mutex::new(Inner {
                cache: RowCache::new(row_bytes, cap),
                hits: 0,
                misses: 0,
                file_reads: 0,
                file_bytes: 0,
                file,
                row: vec![0; row_bytes],
            }),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// Opens the table held by `mapped` (a window of the GGUF mapping) in mode `opt.ple_io`.
    /// `path`/`abs_offset` locate the same bytes in the file for direct reads.
    pub(crate) fn open(mapped: Mat, path: &Path, abs_offset: u64, opt: &PleOptions) -> Result<PleTable, String> {
        let (ty, rows, cols) = (mapped.ty, mapped.rows, mapped.cols);
        let cache = opt.ple_cache_bytes;
        match opt.ple_io {
            PleIo::Mmap => {
                let source = Self::mapped_source(mapped, path, abs_offset)?;
                Ok(Self::build(source, ty, rows, cols, PleIo::Mmap, cache, None))
            }
            PleIo::Ram => {
                let owned = Mat::from_raw(ty, rows, cols, mapped.data()).map_err(|e| e.to_string())?;
                Ok(Self::build(Source::Mat(owned), ty, rows, cols, PleIo::Ram, cache, None))
            }
            PleIo::Direct => {
                let mut warn = None;
                let refused = if opt.simulate_direct_refusal {
                    Err(std::io::Error::from_raw_os_error(EINVAL))
                } else {
                    open_file(path, true)
                };
                let file = match refused {
                    Ok(f) => (f, true),
                    Err(e) if e.raw_os_error() == Some(EINVAL) => {
                        warn = Some(format!(
                            "{}: O_DIRECT refused ({e}); PLE rows use buffered reads (page cache)",
                            path.display()
                        ));
                        let f = open_file(path, false).map_err(|e| format!("{}: {e}", path.display()))?;
                        (f, false)
                    }
                    Err(e) => return Err(format!("{}: {e}", path.display())),
                };
                let t = Self::build(
                    Source::File { path: path.to_path_buf(), base: abs_offset },
                    ty,
                    rows,
                    cols,
                    PleIo::Direct,
                    cache,
                    Some(file),
                );
                if let Some(w) = warn {
                    t.warn(w);
                }
                Ok(t)
            }
        }
    }

    /// The `Mmap` source: the table read through the mapping, guarded by a descriptor of the
    /// file at `path` whose length is checked before each row is read (`mapped_row`).
    ///
    /// A table in no file mapping (a GGUF built in memory, `GgufFile::from_bytes`: its `path` is
    /// only a name) cannot be truncated and is read unchecked; /proc/self/maps tells which. The
    /// descriptor is opened after the GGUF reader mapped the file, by the same path: a path
    /// replaced in between (renamed over) would be checked instead of the mapped file, which the
    /// length check at load only partly catches (the table must fit in the file opened).
    fn mapped_source(mapped: Mat, path: &Path, base: u64) -> Result<Source, String> {
        let table = mapped.data();
        if !table.is_empty() && matches!(in_file_mapping(table.as_ptr() as usize), Ok(false)) {
            return Ok(Source::Mat(mapped));
        }
        let file = open_file(path, false).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        let end = base + table.len() as u64;
        if len < end {
            return Err(format!(
                "{}: PLE table [{base}, {end}) lies past the end of the file ({len} bytes)",
                path.display()
            ));
        }
        Ok(Source::Mapped { mat: mapped, path: path.to_path_buf(), base, file })
    }

    fn warn(&self, w: String) {
        eprintln!("strata: warning: {w}");
        if let Ok(mut v) = self.warnings.lock() {
            v.push(w);
        }
    }

    /// Warnings recorded so far (O_DIRECT fallback).
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// True while rows are read with `O_DIRECT`.
    pub fn direct_active(&self) -> bool {
        self.inner.lock().map(|i| matches!(i.file, Some((_, true)))).unwrap_or(false)
    }

    pub fn stats(&self) -> PleCacheStats {
        let Ok(i) = self.inner.lock() else {
            return PleCacheStats::default();
        };
        PleCacheStats {
            hits: i.hits,
            misses: i.misses,
            evictions: i.cache.evictions,
            capacity_rows: i.cache.capacity_rows(),
            resident_rows: i.cache.len(),
            file_reads: i.file_reads,
            file_bytes: i.file_bytes,
        }
    }

    /// Dequantizes row `r` into `out[..cols]`; errors name the row and the file.
    ///
    /// A mapped table (`Mmap`) checks the file's length before the row is read through the
    /// mapping (`mapped_row`), so a file truncated under a running engine gives an
    /// error here instead of a SIGBUS, except in the window between that check and the read.
    pub fn get_row(&self, r: usize, out: &mut [f32]) -> Result<(), String> {
        if r >= self.rows {
            return Err(format!("PLE row {r} outside the table of {} rows", self.rows));
        }
        let mut g = self.inner.lock().map_err(|_| "PLE table lock poisoned".to_string())?;
        let inner = &mut *g;
        let row = r as u64;
        if let Some(b) = inner.cache.get(row) {
            inner.hits += 1;
            return dequant(self.ty, row, b, &mut out[..self.cols]);
        }
        inner.misses += 1;
        match &self.source {
            Source::Mat(m) => {
                let b = m.row_data(r);
                inner.cache.insert(row, b);
                dequant(self.ty, row, b, &mut out[..self.cols])
            }
            Source::Mapped { mat, path, base, file } => {
                let b = self.mapped_row(mat, path, *base, file, r)?;
                inner.cache.insert(row, b);
                dequant(self.ty, row, b, &mut out[..self.cols])
            }
            Source::File { path, base } => {
                let mut fallback = None;
                self.read_file_row(inner, path, base + row * self.row_bytes as u64, &mut fallback)?;
                if let Some(w) = fallback {
                    self.warn(w);
                }
                let b = std::mem::take(&mut inner.row);
                inner.cache.insert(row, &b);
                let res = dequant(self.ty, row, &b, &mut out[..self.cols]);
                inner.row = b;
                res
            }
        }
    }

    /// Rows `rows[k]` dequantized into `out[k·cols..]`. Same results and hit/miss/eviction
    /// counts as `get_row` per row in order; for a file source the rows that are not cached
    /// at the start are first read once each, in parallel through `par` (an SSD needs queue
    /// depth, not one read at a time).
    pub fn get_rows(&self, rows: &[usize], out: &mut [f32], par: ParFor) -> Result<(), String> {
        let c = self.cols;
        if let Some(&r) = rows.iter().find(|&&r| r >= self.rows) {
            return Err(format!("PLE row {r} outside the table of {} rows", self.rows));
        }
        let Source::File { path, base } = &self.source else {
            for (k, &r) in rows.iter().enumerate() {
                self.get_row(r, &mut out[k * c..(k + 1) * c])?;
            }
            return Ok(());
        };
        let mut g = self.inner.lock().map_err(|_| "PLE table lock poisoned".to_string())?;
        let inner = &mut *g;
        let mut want: Vec<u64> = rows.iter().map(|&r| r as u64).filter(|&r| !inner.cache.contains(r)).collect();
        want.sort_unstable();
        want.dedup();
        let fetched = self.fetch_parallel(inner, path, *base, &want, par)?;
        for (k, &r) in rows.iter().enumerate() {
            let dst = &mut out[k * c..(k + 1) * c];
            let row = r as u64;
            if let Some(b) = inner.cache.get(row) {
                inner.hits += 1;
                dequant(self.ty, row, b, dst)?;
                continue;
            }
            inner.misses += 1;
            if let Some(b) = fetched.get(&row) {
                inner.cache.insert(row, b);
                dequant(self.ty, row, b, dst)?;
                continue;
            }
            // Cached at the start but evicted within this batch: read it again.
            let mut fallback = None;
            self.read_file_row(inner, path, base + row * self.row_bytes as u64, &mut fallback)?;
            if let Some(w) = fallback {
                self.warn(w);
            }
            let b = std::mem::take(&mut inner.row);
            inner.cache.insert(row, &b);
            let res = dequant(self.ty, row, &b, dst);
            inner.row = b;
            res?;
        }
        Ok(())
    }

    /// Row `r` of a mapped table, once `fstat` on `file` shows that the file still holds it.
    ///
    /// Race window: the file may still be truncated between this check and the caller's read
    /// of the returned slice (copied into the cache and dequantized at once, `row_bytes` bytes);
    /// a read past the new end in that window is a SIGBUS, as before the check existed. Closing
    /// it would take reading rows with `pread` (no mapping) or a SIGBUS handler around the copy.
    fn mapped_row<'a>(&self, mat: &'a Mat, path: &Path, base: u64, file: &File, r: usize) -> Result<&'a [u8], String> {
        let rb = self.row_bytes as u64;
        let off = base + r as u64 * rb;
        let len = file.metadata().map_err(|e| format!("{}: PLE row {r}: fstat: {e}", path.display()))?.len();
        if off + rb > len {
            return Err(format!(
                "{}: PLE row {r} at byte {off} ({rb} bytes) lies past the end of the file \
                 ({len} bytes now): the table file was truncated after it was mapped",
                path.display()
            ));
        }
        Ok(mat.row_data(r))
    }

    /// Reads rows `want` (table indices) in parallel through `par`; an O_DIRECT EINVAL reopens
    /// the file buffered (with a warning) and reads them all again.
    fn fetch_parallel(
        &self,
        inner: &mut Inner,
        path: &Path,
        base: u64,
        want: &[u64],
        par: ParFor,
    ) -> Result<HashMap<u64, Vec<u8>>, String> {
        let rb = self.row_bytes;
        loop {
            let Some((file, direct)) = inner.file.as_ref() else {
                return Err(format!("{}: PLE table file not open", path.display()));
            };
            let direct = *direct;
            // On the CPU executor, the forward pass's thread team (rayon's threads are all in it then).
            let res: Vec<OnceLock<std::io::Result<_>>> = want.iter().map(|_| OnceLock::new()).collect();
            par(want.len(), &|i| {
                let r = want[i];
                let _ = res[i].set(read_row(file, direct, base + r * rb as u64, rb).map(|x| (r, x)));
            });
            let res: Vec<_> = res.into_iter().filter_map(OnceLock::into_inner).collect();
            if direct && res.iter().any(|x| matches!(x, Err(e) if e.raw_os_error() == Some(EINVAL))) {
                self.warn(format!("{}: O_DIRECT read refused; PLE rows use buffered reads", path.display()));
                let f = open_file(path, false).map_err(|e| format!("{}: {e}", path.display()))?;
                inner.file = Some((f, false));
                continue;
            }
            let mut map = HashMap::with_capacity(want.len());
            for x in res {
                let (r, (b, n, bytes)) =
                    x.map_err(|e| format!("{}: PLE row read (base {base}): {e}", path.display()))?;
                inner.file_reads += n;
                inner.file_bytes += bytes;
                map.insert(r, b);
            }
            return Ok(map);
        }
    }

    /// Reads the row at absolute `off` into `inner.row` ([`read_row`]). An EINVAL from an
    /// O_DIRECT read (file systems that accept the flag at open but not the read) reopens the
    /// file buffered and retries.
    fn read_file_row(
        &self,
        inner: &mut Inner,
        path: &Path,
        off: u64,
        fallback: &mut Option<String>,
    ) -> Result<(), String> {
        let err = |e: std::io::Error| format!("{}: PLE row read at byte {off}: {e}", path.display());
        loop {
            let Some((file, direct)) = inner.file.as_ref() else {
                return Err(format!("{}: PLE table file not open", path.display()));
            };
            let direct = *direct;
            match read_row(file, direct, off, self.row_bytes) {
                Ok((b, n, bytes)) => {
                    inner.file_reads += n;
                    inner.file_bytes += bytes;
                    inner.row.copy_from_slice(&b);
                    return Ok(());
                }
                Err(e) if direct && e.raw_os_error() == Some(EINVAL) => {
                    *fallback =
                        Some(format!("{}: O_DIRECT read refused ({e}); PLE rows use buffered reads", path.display()));
                    inner.file = Some((open_file(path, false).map_err(err)?, false));
                }
                Err(e) => return Err(err(e)),
            }
        }
    }
}

/// Whether address `addr` lies in a mapping of a file (an inode), by /proc/self/maps; `false`
/// for anonymous memory (heap, no mapping at all).
fn in_file_mapping(addr: usize) -> std::io::Result<bool> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        // start-end perms offset dev inode [path]
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(inode)) = (f.next(), f.nth(3)) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
            continue;
        };
        if (lo..hi).contains(&addr) {
            return Ok(inode.parse::<u64>().is_ok_and(|i| i != 0));
        }
    }
    Ok(false)
}

/// Reads `rb` bytes at absolute `off`: with `direct`, the 4096-aligned span around them into
/// a 4096-aligned buffer (O_DIRECT requires aligned offset, length and address), then copies
/// the row out. Returns (row, pread calls, bytes transferred).
fn read_row(file: &File, direct: bool, off: u64, rb: usize) -> std::io::Result<(Vec<u8>, u64, u64)> {
    let (start, len) = if direct {
        let s = off / ALIGN * ALIGN;
        (s, (off + rb as u64).div_ceil(ALIGN) * ALIGN - s)
    } else {
        (off, rb as u64)
    };
    let (len, need) = (len as usize, (off - start) as usize + rb);
    let mut scratch = vec![0u8; len + ALIGN as usize];
    let shift = scratch.as_ptr().align_offset(ALIGN as usize);
    let buf = &mut scratch[shift..shift + len];
    let (mut got, mut calls) = (0usize, 0u64);
    while got < need {
        match file.read_at(&mut buf[got..], start + got as u64) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                calls += 1;
                got += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let at = (off - start) as usize;
    Ok((buf[at..at + rb].to_vec(), calls, got as u64))
}

/// Checks row `row`'s blocks (the table is too large to check at load, so each row is checked
/// as it is used; a row is a few blocks) and dequantizes it.
fn dequant(ty: GgmlType, row: u64, b: &[u8], out: &mut [f32]) -> Result<(), String> {
    quant::check_blocks(ty, b).map_err(|e| match e {
        quant::QuantError::BadBlock { bad, .. } => format!("PLE row {row}: {bad} (counted from the row's start)"),
        e => format!("PLE row {row}: {e}"),
    })?;
    quant::dequantize_row(ty, b, out).map_err(|e| format!("PLE row dequantize: {e:?}"))
}

#[cfg(test)]
mod tests {
    /// The table is not checked at load, so a row with a bad scale is refused when it is read.
    #[test]
    fn a_row_with_a_bad_scale_is_refused_when_read() {
        let ty = quant::GgmlType::Q8_0;
        let mut row = vec![0u8; 2 * 34];
        let mut out = [0f32; 64];
        assert_eq!(super::dequant(ty, 7, &row, &mut out), Ok(()));
        row[34..36].copy_from_slice(&0x7c00u16.to_le_bytes());
        let e = super::dequant(ty, 7, &row, &mut out).unwrap_err();
        assert_eq!(e, "PLE row 7: block 1 has an infinite scale (d) (counted from the row's start)");
    }
}
