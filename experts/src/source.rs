//! The expert source: every routed expert of an MoE model, served in place from its GGUF shards.
//!
//! A layer's experts are three stacked tensors, `blk.N.ffn_{gate,up,down}_exps.weight` with ggml
//! dims `[n_embd, n_ff, n_expert]` (gate, up) and `[n_ff, n_embd, n_expert]` (down), so expert `e`
//! is three contiguous row spans: rows `e*n_ff .. (e+1)*n_ff` of gate and up, rows
//! `e*n_embd .. (e+1)*n_embd` of down. No re-packing: [`ExpertSource::expert`] hands out slices of
//! the mapped shards (`Residency::Mapped`, the page cache decides what is in RAM) or of one copy
//! in RAM per layer (`Residency::Ram`, the default when it fits).
//!
//! Every span is checked against the tensor directory and the shard's length when the source is
//! opened: an expert tensor whose shape disagrees with the header, a truncated shard, or bytes
//! after the last tensor (an oversized shard, e.g. a concatenation gone wrong) is an
//! [`ExpertError`] naming the file, the tensor and the offset. A lookup out of range is an error
//! too. Mapped shards are re-checked (one `fstat` each) on every lookup, so a file truncated while
//! in use is an error instead of a SIGBUS. Nothing global is kept: after an error the source can
//! simply be opened again.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgufFile, TensorInfo};
use quant::GgmlType;

/// Where the expert bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Slices of the memory-mapped shards (`--mmap-experts`).
    Mapped,
    /// One copy in RAM, read at open.
    Ram,
}

/// How to open a source.
#[derive(Clone, Copy, Debug, Default)]
pub struct SourceOptions {
    /// `--mmap-experts`: keep the experts mapped instead of reading them into RAM.
    pub mmap: bool,
    /// RAM the copy may take (None: `MemAvailable` of /proc/meminfo minus 2 GiB of headroom).
    pub ram_budget: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    #[error("{path}: {source}")]
    Gguf { path: PathBuf, source: gguf::GgufError },
    #[error("{path}: {key}: {why}")]
    Metadata { path: PathBuf, key: String, why: String },
    #[error("{path}: tensor {tensor}: {why}")]
    Shape { path: PathBuf, tensor: String, why: String },
    #[error("{path}: tensor {tensor} (expert {expert}) spans bytes {start}..{end} of the file, which has {len}")]
    Truncated { path: PathBuf, tensor: String, expert: usize, start: u64, end: u64, len: u64 },
    #[error(
        "{path}: {extra} bytes after the last tensor (its data ends at offset {end}, the file has {len}): not a shard as written"
    )]
    Oversized { path: PathBuf, end: u64, len: u64, extra: u64 },
    #[error("{path}: shard now has {len} bytes, {expected} when opened: it was truncated or rewritten while in use")]
    ChangedWhileOpen { path: PathBuf, len: u64, expected: u64 },
    #[error(
        "expert lookup out of range: layer {layer}, expert {expert} (the model has {n_layer} MoE layers of {n_expert} experts)"
    )]
    OutOfRange { layer: usize, expert: usize, n_layer: usize, n_expert: usize },
    #[error(
        "the experts need {need_gib:.1} GiB of RAM and {budget_gib:.1} GiB is available: pass --mmap-experts to serve them from the mapped file"
    )]
    TooLargeForRam { need_gib: f64, budget_gib: f64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

pub type Result<T> = std::result::Result<T, ExpertError>;

/// One expert matrix: rows of `cols` weights of type `ty`.
#[derive(Clone, Copy, Debug)]
pub struct ExpertMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

/// The three matrices of one expert (SwiGLU: `down · (silu(gate·x) ⊙ up·x)`).
#[derive(Clone, Copy, Debug)]
pub struct ExpertView<'a> {
    pub gate: ExpertMatrix<'a>,
    pub up: ExpertMatrix<'a>,
    pub down: ExpertMatrix<'a>,
}

/// Where one stacked tensor of a layer lives.
#[derive(Clone, Debug)]
struct Stack {
    tensor: TensorInfo,
    /// Bytes of one expert (rows per expert × row bytes).
    expert_bytes: usize,
    rows: usize,
    cols: usize,
}

#[derive(Clone, Debug)]
struct LayerExperts {
    block: usize,
    gate: Stack,
    up: Stack,
    down: Stack,
    /// `Residency::Ram`: gate ‖ up ‖ down bytes of this layer.
    ram: Option<Vec<u8>>,
}

/// A shard kept open to notice truncation under the map.
struct OpenShard {
    path: PathBuf,
    file: File,
    len: u64,
}

/// Every routed expert of a model (see the module docs).
pub struct ExpertSource {
    gguf: Arc<GgufFile>,
    layers: Vec<LayerExperts>,
    shards: Vec<OpenShard>,
    residency: Residency,
    n_expert: usize,
    n_embd: usize,
    n_ff: usize,
}

impl std::fmt::Debug for ExpertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertSource")
            .field("layers", &self.layers.len())
            .field("n_expert", &self.n_expert)
            .field("residency", &self.residency)
            .finish()
    }
}

fn u64_key(g: &GgufFile, path: &Path, key: &str) -> Result<usize> {
    let v = g.get_u64(key).map_err(|e| ExpertError::Metadata {
        path: path.to_path_buf(),
        key: key.into(),
        why: e.to_string(),
    })?;
    usize::try_from(v).map_err(|_| ExpertError::Metadata {
        path: path.to_path_buf(),
        key: key.into(),
        why: format!("{v} does not fit"),
    })
}

impl ExpertSource {
    /// Opens the model at `path` (any shard of a split model) and indexes its experts.
    pub fn open(path: &Path, opts: SourceOptions) -> Result<ExpertSource> {
        let g = GgufFile::open(path).map_err(|source| ExpertError::Gguf { path: path.to_path_buf(), source })?;
        Self::from_gguf(Arc::new(g), opts)
    }

    /// Indexes the experts of an opened model.
    pub fn from_gguf(gguf: Arc<GgufFile>, opts: SourceOptions) -> Result<ExpertSource> {
        let path = gguf.paths().first().map(|p| p.to_path_buf()).unwrap_or_default();
        let arch = gguf.architecture().map_err(|source| ExpertError::Gguf { path: path.clone(), source })?.to_string();
        let n_expert = u64_key(&gguf, &path, &format!("{arch}.expert_count"))?;
        let n_embd = u64_key(&gguf, &path, &format!("{arch}.embedding_length"))?;
        let n_layer = u64_key(&gguf, &path, &format!("{arch}.block_count"))?;
        let n_ff = u64_key(&gguf, &path, &format!("{arch}.expert_feed_forward_length"))?;
        if n_expert == 0 {
            return Err(ExpertError::Metadata {
                path,
                key: format!("{arch}.expert_count"),
                why: "0: not a mixture-of-experts model".into(),
            });
        }
        let shards = Self::open_shards(&gguf)?;
        let mut layers = Vec::new();
        for block in 0..n_layer {
            let name = |m: &str| format!("blk.{block}.ffn_{m}_exps.weight");
            let (Some(g), Some(u), Some(d)) =
                (gguf.tensor(&name("gate")), gguf.tensor(&name("up")), gguf.tensor(&name("down")))
            else {
                continue; // a dense layer (some MoE models mix them)
            };
            let shard_path = |t: &TensorInfo| {
                gguf.paths().get(t.file_index).map(|p| p.to_path_buf()).unwrap_or_else(|| path.clone())
            };
            let stack = |t: &TensorInfo, cols: usize, rows: usize| -> Result<Stack> {
                let p = shard_path(t);
                let want = [cols as u64, rows as u64, n_expert as u64];
                if t.dims != want {
                    return Err(ExpertError::Shape {
                        path: p,
                        tensor: t.name.clone(),
                        why: format!(
                            "dims {:?}, the header (embedding_length, expert_feed_forward_length, expert_count) says {want:?}",
                            t.dims
                        ),
                    });
                }
                let row_bytes = t.ty.row_bytes(cols).ok_or_else(|| ExpertError::Shape {
                    path: p.clone(),
                    tensor: t.name.clone(),
                    why: format!("rows of {cols} do not fit {:?} blocks of {}", t.ty, t.ty.block_size()),
                })?;
                let expert_bytes = row_bytes * rows;
                if expert_bytes * n_expert != t.n_bytes {
                    return Err(ExpertError::Shape {
                        path: p,
                        tensor: t.name.clone(),
                        why: format!(
                            "{} bytes in the directory, {n_expert} experts of {expert_bytes} need {}",
                            t.n_bytes,
                            expert_bytes * n_expert
                        ),
                    });
                }
                Ok(Stack { tensor: t.clone(), expert_bytes, rows, cols })
            };
            layers.push(LayerExperts {
                block,
                gate: stack(g, n_embd, n_ff)?,
                up: stack(u, n_embd, n_ff)?,
                down: stack(d, n_ff, n_embd)?,
                ram: None,
            });
        }
        let mut src = ExpertSource { gguf, layers, shards, residency: Residency::Mapped, n_expert, n_embd, n_ff };
        src.check_spans()?;
        if !opts.mmap {
            src.read_into_ram(opts.ram_budget)?;
        }
        Ok(src)
    }

    fn open_shards(g: &GgufFile) -> Result<Vec<OpenShard>> {
        g.paths()
            .iter()
            .map(|p| {
                let io = |source| ExpertError::Io { path: p.to_path_buf(), source };
                let file = File::open(p).map_err(io)?;
                let len = file.metadata().map_err(io)?.len();
                Ok(OpenShard { path: p.to_path_buf(), file, len })
            })
            .collect()
    }

    /// Every expert span inside its shard, and no shard longer than its last tensor.
    fn check_spans(&self) -> Result<()> {
        for l in &self.layers {
            for s in [&l.gate, &l.up, &l.down] {
                let t = &s.tensor;
                let shard = &self.shards[t.file_index];
                let base = self.gguf.data_offset(t.file_index).unwrap_or(0) + t.offset;
                for e in 0..self.n_expert {
                    let start = base + (e * s.expert_bytes) as u64;
                    let end = start + s.expert_bytes as u64;
                    if end > shard.len {
                        return Err(ExpertError::Truncated {
                            path: shard.path.clone(),
                            tensor: t.name.clone(),
                            expert: e,
                            start,
                            end,
                            len: shard.len,
                        });
                    }
                }
            }
        }
        for (i, shard) in self.shards.iter().enumerate() {
            let data = self.gguf.data_offset(i).unwrap_or(0);
            let end = self
                .gguf
                .tensors()
                .iter()
                .filter(|t| t.file_index == i)
                .map(|t| data + t.offset + t.n_bytes as u64)
                .max()
                .unwrap_or(data);
            // Writers pad the data section to the alignment; anything beyond is not theirs.
            let slack = self.gguf.alignment().max(32);
            if shard.len > end + slack {
                return Err(ExpertError::Oversized {
                    path: shard.path.clone(),
                    end,
                    len: shard.len,
                    extra: shard.len - end,
                });
            }
        }
        Ok(())
    }

    /// Total bytes of all experts.
    pub fn total_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| ((l.gate.expert_bytes + l.up.expert_bytes + l.down.expert_bytes) * self.n_expert) as u64)
            .sum()
    }

    fn read_into_ram(&mut self, budget: Option<u64>) -> Result<()> {
        let need = self.total_bytes();
        let budget = budget.or_else(ram_budget).unwrap_or(u64::MAX);
        if need > budget {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(ExpertError::TooLargeForRam { need_gib: gib(need), budget_gib: gib(budget) });
        }
        for i in 0..self.layers.len() {
            let mut buf = Vec::new();
            for which in 0..3 {
                let s = self.layers[i].stack(which);
                buf.extend_from_slice(self.gguf.tensor_data(&s.tensor));
            }
            self.layers[i].ram = Some(buf);
        }
        self.residency = Residency::Ram;
        Ok(())
    }

    pub fn residency(&self) -> Residency {
        self.residency
    }
    /// MoE layers (blocks with expert tensors), in block order.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
    /// The model block of MoE layer `layer`.
    pub fn block(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).map(|l| l.block)
    }
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }
    /// (embedding width, expert FFN width).
    pub fn dims(&self) -> (usize, usize) {
        (self.n_embd, self.n_ff)
    }

    /// Expert `expert` of MoE layer `layer` (see [`Self::n_layers`]).
    pub fn expert(&self, layer: usize, expert: usize) -> Result<ExpertView<'_>> {
        let l = self.layers.get(layer).filter(|_| expert < self.n_expert).ok_or(ExpertError::OutOfRange {
            layer,
            expert,
            n_layer: self.layers.len(),
            n_expert: self.n_expert,
        })?;
        if self.residency == Residency::Mapped {
            for s in [&l.gate, &l.up, &l.down] {
                self.check_shard(s.tensor.file_index)?;
            }
        }
        let mut off = 0;
        let mut part = |which: usize| -> ExpertMatrix<'_> {
            let s = l.stack(which);
            let span = expert * s.expert_bytes..(expert + 1) * s.expert_bytes;
            let data = match &l.ram {
                Some(buf) => &buf[off + span.start..off + span.end],
                None => &self.gguf.tensor_data(&s.tensor)[span],
            };
            off += s.tensor.n_bytes;
            ExpertMatrix { ty: s.tensor.ty, rows: s.rows, cols: s.cols, data }
        };
        Ok(ExpertView { gate: part(0), up: part(1), down: part(2) })
    }

    /// A mapped shard still has the length it had at open (else touching it could SIGBUS).
    fn check_shard(&self, i: usize) -> Result<()> {
        let s = &self.shards[i];
        let len = s.file.metadata().map_err(|source| ExpertError::Io { path: s.path.clone(), source })?.len();
        if len != s.len {
            return Err(ExpertError::ChangedWhileOpen { path: s.path.clone(), len, expected: s.len });
        }
        Ok(())
    }
}

impl LayerExperts {
    fn stack(&self, which: usize) -> &Stack {
        [&self.gate, &self.up, &self.down][which]
    }
}

/// Memory left to everything else when experts are read into RAM.
pub const RAM_HEADROOM: u64 = 2 << 30;

/// RAM a copy of the experts may take: `MemAvailable` minus [`RAM_HEADROOM`] (None: unknown).
pub fn ram_budget() -> Option<u64> {
    mem_available().map(|m| m.saturating_sub(RAM_HEADROOM))
}

/// `MemAvailable` of /proc/meminfo, in bytes (None where there is no such file).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
