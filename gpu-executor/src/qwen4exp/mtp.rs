//! The MTP (NextN) draft head on the device: `program::mtp_forward` over the same operations as
//! the trunk's layers ([`super::exec`]), with the head's block uploaded once ([`GpuMtp`]) and its
//! attention cache in a head session (a [`GpuQwen4ExpSession`] holding that one layer's state).
//!
//! What crosses to the host: the trunk's wide residuals come back with its logits
//! ([`GpuQwen4Exp::eval_hidden`]) and are uploaded with the head's real pairs (`hc · n_embd`
//! floats a token, 40 KB at Flash-Next's size). A drafter's steps ([`GpuMtpHead::forward_top`],
//! [`GpuMtpHead::chain`]) take the greedy token on the device (`logits_top`) and chain on the
//! head's own output streams there: 8 bytes a step come back. [`GpuMtpHead::forward`] reads the
//! logits and streams back (tests, other drafters).
//! The head's experts are all resident (they are not in the trunk's expert cache).

use std::sync::Arc;

use super::exec::GpuQwen4ExpChunk;
use super::scratch::Scratch;
use super::weights::{DevMixer, DevMtp, upload_mtp};
use super::{GpuQwen4Exp, GpuQwen4ExpSession, WINDOW, attn_state, check_cells, kv_format};
use crate::device::{DevicePtr, GpuApi};
use crate::upload::{Uploader, weights_do_not_fit};
use cpu_executor::kv_cache::KvType;
use model::error::{EngineError, Result};
use model::qwen4exp::Mtp;
use model::qwen4exp::mtp::MtpOut;

/// An MTP head resident on the device of a [`GpuQwen4Exp`] (whose token table, output matrix
/// and output mixer it uses unless the head file has its own).
pub struct GpuMtp<'a> {
    g: &'a GpuQwen4Exp,
    /// The head as read from its file.
    pub host: Mtp,
    w: DevMtp,
    allocs: Vec<DevicePtr>,
    /// Bytes of the head's weights on the device.
    pub weight_bytes: usize,
}

impl Drop for GpuMtp<'_> {
    fn drop(&mut self) {
        let api = self.g.api();
        for p in self.allocs.drain(..) {
            let _ = api.free(p);
        }
    }
}

impl<'a> GpuMtp<'a> {
    /// Uploads `host` (read with `Mtp::open` against `g.m`, which checked that they agree).
    pub fn new(g: &'a GpuQwen4Exp, host: Mtp) -> Result<GpuMtp<'a>> {
        let hp = &g.m.hp;
        if (hp.n_embd, hp.n_vocab, hp.n_layer, hp.hc) != (host.n_embd, host.n_vocab, host.block, host.hc) {
            return Err(EngineError::MtpMismatch {
                key: "model (embedding, vocabulary, trunk layers, streams)".into(),
                mtp: format!("({}, {}, {}, {})", host.n_embd, host.n_vocab, host.block, host.hc),
                model: format!("({}, {}, {}, {})", hp.n_embd, hp.n_vocab, hp.n_layer, hp.hc),
            });
        }
        let api = g.api().clone();
        let mut up = Uploader::new(&*api, g.opts().ordered);
        let w = upload_mtp(&mut up, &host).map_err(weights_do_not_fit)?;
        let (allocs, weight_bytes) = up.finish();
        Ok(GpuMtp { g, host, w, allocs, weight_bytes })
    }

    /// An empty head cache of up to `max_ctx` cells of `kv` (f16 or int8), with its buffers.
    pub fn new_session(&self, kv: KvType, max_ctx: usize) -> Result<GpuQwen4ExpSession> {
        let fmt = kv_format(kv)?;
        let capacity = max_ctx.max(1);
        let DevMixer::Attn(a) = &self.w.layer.mixer else {
            return Err(EngineError::StateMismatch { layer: self.host.block });
        };
        check_cells(a, self.host.block, capacity)?;
        let api: Arc<dyn GpuApi> = self.g.api().clone();
        let mut up = Uploader::new(&*api, false);
        let state = attn_state(&mut up, a, fmt, capacity, &mut Vec::new())?;
        let sc = Scratch::new(&mut up, self.g, capacity, Some(&self.host), WINDOW)?;
        let (allocs, _) = up.finish();
        Ok(GpuQwen4ExpSession {
            n_past: 0,
            capacity,
            kv: fmt,
            layers: vec![state],
            ple: None,
            sc,
            allocs,
            api,
            chunk: WINDOW,
            profile: None,
            trace: None,
            graphs: Vec::new(),
            graph_replays: 0,
            eager_windows: 0,
            failed: None,
        })
    }

    /// Runs the pairs `(tokens[i], wide[i])` at the head session's next cells (`wide`
    /// `[n][hc][n_embd]`), in windows of up to [`WINDOW`]: the logits of every pair
    /// (`all_logits`) or of the last, and the head's output streams of every pair (the CPU
    /// head's `MtpCpu::forward`, on the device).
    pub fn forward(
        &self,
        s: &mut GpuQwen4ExpSession,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut> {
        self.check_pairs(s, tokens, wide)?;
        let (n, w) = (tokens.len(), self.host.width());
        let mut out = MtpOut { logits: Vec::new(), hidden: Vec::with_capacity(n * w) };
        let n_windows = n.div_ceil(WINDOW);
        let graph = self.graphs(s);
        for (i, (win, wide)) in tokens.chunks(WINDOW).zip(wide.chunks(WINDOW * w)).enumerate() {
            let last = i + 1 == n_windows;
            let mut chunk = GpuQwen4ExpChunk::for_head(self.g, s, win, wide, (&self.host, &self.w), graph)?;
            chunk.run()?;
            let (logits, hidden) = chunk.finish(all_logits, true)?;
            if all_logits || last {
                out.logits.extend_from_slice(&logits);
            }
            out.hidden.extend_from_slice(&hidden);
        }
        Ok(out)
    }

    /// [`GpuMtp::forward`] for a drafter: the greedy token of the last pair and its
    /// probability, taken on the device (`logits_top`), so neither the logits nor the head's
    /// output streams are read back; the streams stay for [`GpuMtp::chain`]. Returns them with
    /// the last window's row count.
    pub fn forward_top(&self, s: &mut GpuQwen4ExpSession, tokens: &[u32], wide: &[f32]) -> Result<((u32, f32), usize)> {
        self.check_pairs(s, tokens, wide)?;
        let w = self.host.width();
        let graph = self.graphs(s);
        let mut top = None;
        for (win, wide) in tokens.chunks(WINDOW).zip(wide.chunks(WINDOW * w)) {
            let mut chunk = GpuQwen4ExpChunk::for_head(self.g, s, win, wide, (&self.host, &self.w), graph)?;
            chunk.run()?;
            top = Some((chunk.finish_top()?, win.len()));
        }
        top.ok_or(EngineError::EmptyInput)
    }

    /// One chained draft step: `token` at the head session's next cell, with the head's own
    /// output streams of row `from_row` of its previous window as the wide residual (they never
    /// leave the device); its greedy token and probability.
    pub fn chain(&self, s: &mut GpuQwen4ExpSession, token: u32, from_row: usize) -> Result<(u32, f32)> {
        if token as usize >= self.host.n_vocab {
            return Err(EngineError::BadTokenAt { token, index: 0, n_vocab: self.host.n_vocab });
        }
        if s.n_past + 1 > s.capacity {
            return Err(EngineError::ContextFull { needed: s.n_past + 1, capacity: s.capacity });
        }
        let graph = self.graphs(s);
        let toks = [token];
        let mut chunk = GpuQwen4ExpChunk::for_head_chained(self.g, s, &toks, from_row, (&self.host, &self.w), graph)?;
        chunk.run()?;
        chunk.finish_top()
    }

    /// Graphs as for the trunk: nothing in a head window reads back when its experts run by
    /// device dispatch.
    fn graphs(&self, s: &GpuQwen4ExpSession) -> bool {
        self.g.opts().graphs && s.profile.is_none() && super::exec::moe_on_device(self.g.opts(), &self.w.layer.moe)
    }

    /// Refuses pairs the head session cannot take (its own session, tokens in the vocabulary,
    /// one wide residual a token, room in its cache).
    fn check_pairs(&self, s: &GpuQwen4ExpSession, tokens: &[u32], wide: &[f32]) -> Result<()> {
        let (n, w, v) = (tokens.len(), self.host.width(), self.host.n_vocab);
        if s.layers.len() != 1 || s.ple.is_some() {
            return Err(EngineError::StateMismatch { layer: self.host.block });
        }
        if let Some(index) = tokens.iter().position(|&t| t as usize >= v) {
            return Err(EngineError::BadTokenAt { token: tokens[index], index, n_vocab: v });
        }
        if wide.len() != n * w {
            return Err(EngineError::MtpInput { got: wide.len(), tokens: n, width: w });
        }
        let needed = s.n_past + n;
        if needed > s.capacity {
            return Err(EngineError::ContextFull { needed, capacity: s.capacity });
        }
        Ok(())
    }
}

/// A [`GpuMtp`] with its head session: what the speculative drafter (`spec::MtpDrafter`) drives.
pub struct GpuMtpHead<'a> {
    head: &'a GpuMtp<'a>,
    s: GpuQwen4ExpSession,
    /// Rows of the head's last window whose output streams are still on the device (what a
    /// chained step reads), or None.
    last_rows: Option<usize>,
}

impl<'a> GpuMtpHead<'a> {
    /// `kv` should be the target's cache type, `max_ctx` its context.
    pub fn new(head: &'a GpuMtp<'a>, kv: KvType, max_ctx: usize) -> Result<GpuMtpHead<'a>> {
        Ok(GpuMtpHead { head, s: head.new_session(kv, max_ctx)?, last_rows: None })
    }

    /// Cells of the head's cache.
    pub fn cells(&self) -> usize {
        self.s.n_past
    }

    /// Head windows replayed from graphs, and launched eagerly.
    pub fn windows(&self) -> (usize, usize) {
        (self.s.graph_replays, self.s.eager_windows)
    }
}

// The engine's `spec::MtpHead` (the drafter's view of a head) delegates to these.
impl GpuMtpHead<'_> {
    /// Floats of one wide residual (`hc · n_embd`).
    pub fn width(&self) -> usize {
        self.head.host.width()
    }

    /// The cells after `cells` are overwritten by the next pairs (dense attention reads only
    /// the cells before each position).
    pub fn truncate(&mut self, cells: usize) {
        self.s.n_past = self.s.n_past.min(cells);
        self.last_rows = None;
    }

    /// Forgets the sequence (an empty cache).
    pub fn reset(&mut self) {
        self.s.n_past = 0;
        self.last_rows = None;
    }

    /// Runs the pairs `(tokens[i], wide[i])` at the next cells: logits of the last pair (or
    /// all) and the head's output streams of every pair.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> std::result::Result<MtpOut, EngineError> {
        self.last_rows = None;
        let out = self.head.forward(&mut self.s, tokens, wide, all_logits)?;
        self.last_rows = Some((tokens.len() - 1) % WINDOW + 1);
        Ok(out)
    }

    /// The greedy draft after the pairs `(tokens[i], wide[i])` and its probability, taken on
    /// the device ([`GpuMtp::forward_top`]).
    pub fn forward_top(&mut self, tokens: &[u32], wide: &[f32]) -> std::result::Result<(u32, f32), EngineError> {
        self.last_rows = None;
        let (top, rows) = self.head.forward_top(&mut self.s, tokens, wide)?;
        self.last_rows = Some(rows);
        Ok(top)
    }

    /// The next draft after `token` (the previous draft), from the head's own output streams
    /// on the device ([`GpuMtp::chain`]).
    pub fn chain(&mut self, token: u32) -> std::result::Result<(u32, f32), EngineError> {
        let rows = self
            .last_rows
            .take()
            .ok_or_else(|| EngineError::Unsupported("an MTP draft chain without a head window before it".into()))?;
        let top = self.head.chain(&mut self.s, token, rows - 1)?;
        self.last_rows = Some(1);
        Ok(top)
    }
}
