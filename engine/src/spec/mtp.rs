//! [`MtpDrafter`]: drafts with the qwen4exp model's own MTP head ([`Mtp`]).
//!
//! The head turns a pair (the trunk's wide residual `h_p`: all hc streams; token `t_{p+1}`)
//! at position p into logits for `t_{p+2}`. Its attention cache holds one cell per position, and a cell is only kept if
//! it came from a *real* pair (a hidden state of the target over accepted tokens):
//!
//! ```text
//! target consumed t_0..t_{P-1} (hidden h_0..h_{P-1} observed), last = t_P not consumed yet
//! propose: truncate the cache to the committed cells c, run the real pairs
//!          (h_c, t_{c+1}) .. (h_{P-1}, t_P) at positions c..P-1 in one batch → d1, h'
//!          commit c = P; then chain: (h', d_i) at position P+i-1 → d_{i+1}, h' ← its output
//! ```
//! The chained cells (positions ≥ P) are built from the head's own `h'` and unverified
//! drafts, so the next proposal truncates them away before it adds the real pairs of the
//! tokens accepted meanwhile — with the hidden states the verify pass computed for them. A
//! rejected draft therefore never stays in the cache, and the drafts of every step equal those
//! of a fresh head run over the accepted history (the tests check this bit for bit).
//!
//! Each draft carries the head's softmax probability of its (argmax) token; chaining stops at
//! the first draft below `min_p` (the loop would cut the window there anyway).

use cpu_executor::prelude::*;
use model::error::EngineError;
use model::loaded::Numerics;
use model::qwen4exp::mtp::MtpOut;
use model::qwen4exp::{KvType, Mtp, MtpState, Qwen4Exp};

use super::{Draft, Drafter, argmax};

/// Pairs per head call when catching up (bounds activation memory on long prompts).
const UBATCH: usize = 512;

/// Counters of an [`MtpDrafter`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MtpDrafterStats {
    /// Calls of `propose` that returned drafts.
    pub proposals: u64,
    /// Real pairs run through the head (the prompt included) and chained steps run.
    pub real_rows: u64,
    pub chained_rows: u64,
    /// Committed real pairs that had to be run again (a proposal without new tokens).
    pub recomputed: u64,
    /// Proposals refused because the history did not continue what was observed, or hidden
    /// states were missing (the drafter then proposes nothing; never happens in the spec loop).
    pub desyncs: u64,
    /// Head forward errors (none expected: tokens are checked by the loop).
    pub errors: u64,
}

/// An MTP head with its attention cache, on some backend: what [`MtpDrafter`] drives.
pub trait MtpHead {
    /// Floats of one wide residual (`hc · n_embd`).
    fn width(&self) -> usize;
    /// Keeps the cache's first `cells` cells.
    fn truncate(&mut self, cells: usize);
    /// Forgets the sequence (an empty cache).
    fn reset(&mut self);
    /// Runs the pairs `(tokens[i], wide[i])` at the next cells (see `MtpCpu::forward`):
    /// logits of the last pair (or all) and the head's output streams of every pair.
    fn forward(&mut self, tokens: &[u32], wide: &[f32], all_logits: bool) -> Result<MtpOut, EngineError>;
    /// [`MtpHead::forward`] for drafting: the greedy token after the last pair and its
    /// probability, taken where the head runs, so its logits and output streams need not come
    /// back. None: this head has no such path (the drafter uses `forward`).
    fn forward_top(&mut self, _tokens: &[u32], _wide: &[f32]) -> Option<Result<Draft, EngineError>> {
        None
    }
    /// The draft after `token` (the last draft), from the head's own last output streams where
    /// they are (after `forward_top` or `chain_top`). None: no such path.
    fn chain_top(&mut self, _token: u32) -> Option<Result<Draft, EngineError>> {
        None
    }
}

/// The head on the CPU (`cpu::qwen4exp::MtpCpu`).
pub struct CpuMtpHead<'a> {
    pub model: &'a Qwen4Exp,
    pub mtp: &'a Mtp,
    kv: KvType,
    st: MtpState,
}

impl<'a> CpuMtpHead<'a> {
    /// `kv` should be the target's cache type.
    pub fn new(model: &'a Qwen4Exp, mtp: &'a Mtp, kv: KvType) -> CpuMtpHead<'a> {
        Self::with_numerics(model, mtp, kv, Numerics::Llama)
    }

    /// [`CpuMtpHead::new`] in the float order `numerics` (the target session's).
    pub fn with_numerics(model: &'a Qwen4Exp, mtp: &'a Mtp, kv: KvType, numerics: Numerics) -> CpuMtpHead<'a> {
        let mut st = mtp.new_state(kv);
        st.numerics = numerics;
        CpuMtpHead { model, mtp, kv, st }
    }

    /// The head's cache (tests compare it with a fresh run).
    pub fn state(&self) -> &MtpState {
        &self.st
    }
}

impl MtpHead for CpuMtpHead<'_> {
    fn width(&self) -> usize {
        self.mtp.width()
    }

    fn truncate(&mut self, cells: usize) {
        self.mtp.truncate(&mut self.st, cells);
    }

    fn reset(&mut self) {
        let numerics = self.st.numerics;
        self.st = self.mtp.new_state(self.kv);
        self.st.numerics = numerics;
    }

    fn forward(&mut self, tokens: &[u32], wide: &[f32], all_logits: bool) -> Result<MtpOut, EngineError> {
        MtpCpu::forward(self.mtp, self.model, &mut self.st, tokens, wide, all_logits)
    }
}

/// The head on the device (`gpu::qwen4exp::GpuMtpHead`, whose methods these are).
#[cfg(feature = "gpu")]
impl MtpHead for gpu_executor::qwen4exp::GpuMtpHead<'_> {
    fn width(&self) -> usize {
        gpu_executor::qwen4exp::GpuMtpHead::width(self)
    }

    fn truncate(&mut self, cells: usize) {
        gpu_executor::qwen4exp::GpuMtpHead::truncate(self, cells)
    }

    fn reset(&mut self) {
        gpu_executor::qwen4exp::GpuMtpHead::reset(self)
    }

    fn forward(&mut self, tokens: &[u32], wide: &[f32], all_logits: bool) -> Result<MtpOut, EngineError> {
        gpu_executor::qwen4exp::GpuMtpHead::forward(self, tokens, wide, all_logits)
    }

    fn forward_top(&mut self, tokens: &[u32], wide: &[f32]) -> Option<Result<Draft, EngineError>> {
        Some(gpu_executor::qwen4exp::GpuMtpHead::forward_top(self, tokens, wide).map(|(token, p)| Draft { token, p }))
    }

    fn chain_top(&mut self, token: u32) -> Option<Result<Draft, EngineError>> {
        Some(gpu_executor::qwen4exp::GpuMtpHead::chain(self, token).map(|(token, p)| Draft { token, p }))
    }
}

/// Drafter over a qwen4exp model's MTP head (see the module docs), on the CPU or the device.
pub struct MtpDrafter<H: MtpHead> {
    head: H,
    /// Cells `0..committed` of the head's cache come from real pairs.
    committed: usize,
    /// Trunk wide residuals of positions `hid_start..`, row-major `[.][hc·n_embd]`.
    hidden: Vec<f32>,
    hid_start: usize,
    /// Tokens the target has consumed (sum of observed lengths).
    consumed: usize,
    /// An observation came without (or with ragged) hidden states.
    broken: bool,
    /// Stop chaining after a draft whose probability is below this.
    pub min_p: f32,
    pub stats: MtpDrafterStats,
}

impl<'a> MtpDrafter<CpuMtpHead<'a>> {
    /// A drafter on the CPU for one sequence; `kv` should be the target's cache type.
    pub fn new(model: &'a Qwen4Exp, mtp: &'a Mtp, kv: KvType, min_p: f32) -> MtpDrafter<CpuMtpHead<'a>> {
        MtpDrafter::with_head(CpuMtpHead::new(model, mtp, kv), min_p)
    }

    /// The head's cache (tests compare it with a fresh run).
    pub fn state(&self) -> &MtpState {
        self.head.state()
    }
}

impl<H: MtpHead> MtpDrafter<H> {
    /// A drafter for one sequence over `head` (an empty cache).
    pub fn with_head(head: H, min_p: f32) -> MtpDrafter<H> {
        MtpDrafter {
            head,
            committed: 0,
            hidden: Vec::new(),
            hid_start: 0,
            consumed: 0,
            broken: false,
            min_p,
            stats: MtpDrafterStats::default(),
        }
    }

    /// Forgets the sequence (a new one starts at position 0).
    pub fn reset(&mut self) {
        self.head.reset();
        self.committed = 0;
        self.hidden.clear();
        self.hid_start = 0;
        self.consumed = 0;
        self.broken = false;
        self.stats = MtpDrafterStats::default();
    }

    /// The head it drafts with.
    pub fn head(&self) -> &H {
        &self.head
    }

    /// Cells built from real pairs.
    pub fn committed(&self) -> usize {
        self.committed
    }

    fn desync(&mut self) -> Vec<Draft> {
        self.stats.desyncs += 1;
        Vec::new()
    }
}

/// The argmax (lowest id on ties) and its softmax probability.
fn top(logits: &[f32]) -> Draft {
    let token = argmax(logits);
    let max = logits[token as usize];
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    Draft { token, p: (1.0 / sum) as f32 }
}

impl<H: MtpHead> Drafter for MtpDrafter<H> {
    fn wants_hidden(&self) -> bool {
        true
    }

    fn reset(&mut self) {
        MtpDrafter::reset(self)
    }

    fn observe(&mut self, tokens: &[u32], hidden: &[f32]) {
        let e = self.head.width();
        if hidden.len() != tokens.len() * e {
            self.broken = true;
        } else {
            self.hidden.extend_from_slice(hidden);
        }
        self.consumed += tokens.len();
    }

    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft> {
        let (e, p) = (self.head.width(), self.consumed);
        if max == 0 {
            return Vec::new();
        }
        // The target consumed everything but the last history token.
        if self.broken || p == 0 || history.len() != p + 1 {
            return self.desync();
        }
        // Real pairs from the first uncommitted cell (at least the last one, which yields d1).
        let start = self.committed.min(p - 1);
        let rows = self.hidden.len() / e;
        if self.hid_start > start || self.hid_start + rows != p {
            return self.desync();
        }
        self.stats.recomputed += (self.committed - start) as u64;
        self.head.truncate(start);
        let h = &self.hidden[(start - self.hid_start) * e..];
        // In micro-batches (a long prompt's pairs), like the trunk; only the last row's
        // logits are needed.
        let toks = &history[start + 1..=p];
        let n_chunks = toks.len().div_ceil(UBATCH);
        // The last chunk's draft: on the head's device when it has that path (nothing but the
        // token and its probability comes back), else from its logits here.
        let mut first: Option<(Draft, Option<Vec<f32>>)> = None;
        for (ci, chunk) in toks.chunks(UBATCH).enumerate() {
            let hc = &h[ci * UBATCH * e..][..chunk.len() * e];
            let ran = match (ci + 1 == n_chunks).then(|| self.head.forward_top(chunk, hc)).flatten() {
                Some(r) => r.map(|d| (d, None)),
                None => self
                    .head
                    .forward(chunk, hc, false)
                    .map(|o| (top(&o.logits), Some(o.hidden[o.hidden.len() - e..].to_vec()))),
            };
            match ran {
                Ok(d) => first = Some(d),
                Err(_) => {
                    self.stats.errors += 1;
                    self.head.truncate(start);
                    self.committed = start;
                    return Vec::new();
                }
            }
        }
        let Some((mut d, mut h_cur)) = first else {
            return self.desync();
        };
        self.stats.real_rows += (p - start) as u64;
        self.committed = p;
        // Keep h_{p-1}: a proposal without new tokens re-runs the last real pair.
        let drop = (p - 1 - self.hid_start) * e;
        self.hidden.drain(..drop);
        self.hid_start = p - 1;

        let mut drafts = Vec::with_capacity(max);
        loop {
            drafts.push(d);
            if drafts.len() == max || d.p < self.min_p {
                break;
            }
            // Chained from the head's own streams: where it ran (None: they came back here).
            let step = match &h_cur {
                None => self
                    .head
                    .chain_top(d.token)
                    .unwrap_or_else(|| Err(EngineError::Unsupported("a device draft chain on a host head".into())))
                    .map(|d| (d, None)),
                Some(h) => self.head.forward(&[d.token], h, false).map(|o| (top(&o.logits), Some(o.hidden))),
            };
            match step {
                Ok((next, h)) => {
                    self.stats.chained_rows += 1;
                    (d, h_cur) = (next, h);
                }
                Err(_) => {
                    self.stats.errors += 1;
                    break;
                }
            }
        }
        self.stats.proposals += 1;
        drafts
    }
}
