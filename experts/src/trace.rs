//! Routing traces: what the router chose, token by token and layer by layer.
//!
//! File format (`--dump-routing`, as the C++ engine writes it), little-endian, one record per
//! token and MoE layer: `i32 layer, i32 k, k × i32 expert ids, k × f32 router weights`.
//!
//! [`synthetic`] writes traces with the shape measured on Flash-Next (llama.cpp PR #27861, see
//! docs/expert-tiering.md): weak static skew (a learned top-32 list per layer covers ~10% of
//! held-out traffic, uniform would be 6.25%) and strong temporal locality (LRU with 64 slots per
//! layer hits ~67%, with 128 slots ~81%). Each layer keeps a drifting "topic": a small set of
//! experts the current stretch of text keeps using. A choice reuses one of the topic's experts
//! with probability `reuse`, otherwise it draws from a mildly skewed global distribution; the
//! topic slowly drifts (one member replaced per token with probability `drift`).

use std::path::Path;

/// One routing decision: MoE layer, chosen experts, their router weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub layer: u32,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: at byte {offset}: {why}")]
    Format { path: String, offset: usize, why: String },
}

/// Reads a `--dump-routing` file; `n_expert` (when known) bounds the ids.
pub fn read(path: &Path, n_expert: Option<u32>) -> Result<Vec<Routing>, TraceError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io { path: p.clone(), source })?;
    parse(&p, &bytes, n_expert)
}

pub fn parse(path: &str, bytes: &[u8], n_expert: Option<u32>) -> Result<Vec<Routing>, TraceError> {
    let err = |offset: usize, why: String| TraceError::Format { path: path.to_string(), offset, why };
    let word = |at: usize| -> Result<[u8; 4], TraceError> {
        bytes.get(at..at + 4).map(|b| b.try_into().expect("4 bytes")).ok_or_else(|| err(at, "truncated record".into()))
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let layer = i32::from_le_bytes(word(at)?);
        let k = i32::from_le_bytes(word(at + 4)?);
        if layer < 0 || !(1..=256).contains(&k) {
            return Err(err(
                start,
                format!("record header layer {layer}, k {k}: expected layer >= 0 and 1 <= k <= 256"),
            ));
        }
        at += 8;
        let mut ids = Vec::with_capacity(k as usize);
        for _ in 0..k {
            let id = i32::from_le_bytes(word(at)?);
            if id < 0 || n_expert.is_some_and(|n| id as u32 >= n) {
                return Err(err(at, format!("expert id {id} out of range (layer {layer})")));
            }
            ids.push(id as u32);
            at += 4;
        }
        let mut weights = Vec::with_capacity(k as usize);
        for _ in 0..k {
            weights.push(f32::from_le_bytes(word(at)?));
            at += 4;
        }
        out.push(Routing { layer: layer as u32, ids, weights });
    }
    Ok(out)
}

pub fn to_bytes(trace: &[Routing]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in trace {
        out.extend_from_slice(&(r.layer as i32).to_le_bytes());
        out.extend_from_slice(&(r.ids.len() as i32).to_le_bytes());
        r.ids.iter().for_each(|&id| out.extend_from_slice(&(id as i32).to_le_bytes()));
        r.weights.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
    }
    out
}

// ------------------------------------------------------------------ recording (--dump-routing)

/// The process's routing dump (`--dump-routing FILE`): a diagnostic of the whole run, like a
/// log, so it is one process-wide writer that every MoE implementation (CPU, GPU, Flash-Next)
/// appends to without threading a handle through the forward pass. Records of a forward chunk
/// come layer by layer, token by token within a layer.
struct Dump {
    path: std::path::PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    records: u64,
    error: Option<std::io::Error>,
}

static DUMP: std::sync::Mutex<Option<Dump>> = std::sync::Mutex::new(None);
static DUMPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Starts recording every routing decision into `path` (created or truncated).
pub fn dump_to(path: &Path) -> Result<(), TraceError> {
    let file =
        std::fs::File::create(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    let d = Dump { path: path.to_path_buf(), out: std::io::BufWriter::new(file), records: 0, error: None };
    *DUMP.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
    DUMPING.store(true, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// Whether `--dump-routing` is on (one relaxed load: free when off).
#[inline]
pub fn dumping() -> bool {
    DUMPING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Appends one record (a write error is kept and reported by [`finish_dump`]).
pub fn dump(layer: usize, ids: &[u32], weights: &[f32]) {
    use std::io::Write;
    let mut g = DUMP.lock().unwrap_or_else(|p| p.into_inner());
    let Some(d) = g.as_mut() else { return };
    if d.error.is_some() {
        return;
    }
    let r = Routing { layer: layer as u32, ids: ids.to_vec(), weights: weights.to_vec() };
    if let Err(e) = d.out.write_all(&to_bytes(std::slice::from_ref(&r))) {
        d.error = Some(e);
    }
    d.records += 1;
}

/// Flushes and closes the dump: the number of records, or the first write error.
pub fn finish_dump() -> Result<Option<(std::path::PathBuf, u64)>, TraceError> {
    use std::io::Write;
    DUMPING.store(false, std::sync::atomic::Ordering::Release);
    let Some(mut d) = DUMP.lock().unwrap_or_else(|p| p.into_inner()).take() else { return Ok(None) };
    let io = |source| TraceError::Io { path: d.path.display().to_string(), source };
    if let Some(e) = d.error.take() {
        return Err(io(e));
    }
    d.out.flush().map_err(|source| TraceError::Io { path: d.path.display().to_string(), source })?;
    Ok(Some((d.path, d.records)))
}

/// Parameters of [`synthetic`].
#[derive(Clone, Copy, Debug)]
pub struct TraceShape {
    pub n_layers: u32,
    pub n_expert: u32,
    /// Experts per token (Flash-Next: 10).
    pub k: u32,
    pub tokens: usize,
    /// Size of each layer's topic set.
    pub topic: usize,
    /// Probability that a choice comes from the topic.
    pub reuse: f64,
    /// Probability per token and layer that one topic member is replaced.
    pub drift: f64,
    /// Exponent of the global (Zipf-like) distribution: small = weak static skew.
    pub skew: f64,
    pub seed: u64,
}

impl TraceShape {
    /// Flash-Next's published shape (48 layers x 512 experts, top-10), tuned so that LRU and a
    /// learned top-32 list reproduce the measured hit rates (docs/expert-tiering.md).
    pub fn qwen4exp(tokens: usize, seed: u64) -> TraceShape {
        TraceShape { n_layers: 48, n_expert: 512, k: 10, tokens, topic: 48, reuse: 0.78, drift: 0.25, skew: 0.35, seed }
    }
}

use rng::SplitMix64 as Rng;

/// A synthetic routing trace of the given shape, token-major (all layers of token 0, then 1, ...).
pub fn synthetic(s: &TraceShape) -> Vec<Routing> {
    let mut rng = Rng(s.seed);
    let n = s.n_expert as usize;
    // Per layer: a random permutation gives each expert its global popularity rank.
    let mut cdf_by_layer = Vec::new();
    let mut perm_by_layer = Vec::new();
    let mut topics = Vec::new();
    for _ in 0..s.n_layers {
        let mut perm: Vec<u32> = (0..s.n_expert).collect();
        for i in (1..n).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let w: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(s.skew)).collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        cdf_by_layer.push(
            w.iter()
                .map(|x| {
                    acc += x / total;
                    acc
                })
                .collect::<Vec<f64>>(),
        );
        let topic: Vec<u32> = (0..s.topic).map(|_| perm[rng.below(n)]).collect();
        topics.push(topic);
        perm_by_layer.push(perm);
    }
    let global = |rng: &mut Rng, l: usize| -> u32 {
        let u = rng.unit();
        let r = cdf_by_layer[l].partition_point(|&c| c < u).min(n - 1);
        perm_by_layer[l][r]
    };
    let mut out = Vec::with_capacity(s.tokens * s.n_layers as usize);
    for _ in 0..s.tokens {
        for l in 0..s.n_layers as usize {
            if rng.unit() < s.drift {
                let slot = rng.below(s.topic);
                topics[l][slot] = global(&mut rng, l);
            }
            let mut ids: Vec<u32> = Vec::with_capacity(s.k as usize);
            while ids.len() < s.k as usize {
                let id = if rng.unit() < s.reuse { topics[l][rng.below(s.topic)] } else { global(&mut rng, l) };
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            let weights = vec![1.0 / s.k as f32; s.k as usize];
            out.push(Routing { layer: l as u32, ids, weights });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_routing_round_trip_and_errors() {
        let t = synthetic(&TraceShape {
            n_layers: 2,
            n_expert: 16,
            k: 3,
            tokens: 5,
            topic: 4,
            reuse: 0.5,
            drift: 0.1,
            skew: 0.3,
            seed: 1,
        });
        assert_eq!(t.len(), 10);
        assert!(t.iter().all(|r| r.ids.len() == 3 && r.ids.iter().all(|&i| i < 16)));
        let b = to_bytes(&t);
        assert_eq!(b.len(), 10 * (8 + 3 * 8));
        assert_eq!(parse("t", &b, Some(16)).unwrap(), t);
        let e = |b: &[u8], n| parse("t", b, n).unwrap_err().to_string();
        assert!(e(&b[..b.len() - 2], Some(16)).contains("at byte 316: truncated record"));
        assert!(e(&b, Some(4)).contains("out of range"));
        let mut bad_k = b.clone();
        bad_k[4..8].copy_from_slice(&0i32.to_le_bytes());
        assert!(e(&bad_k, None).contains("at byte 0: record header layer 0, k 0"));
    }
}
