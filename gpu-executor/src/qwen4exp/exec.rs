//! Flash-Next's operations ([`Qwen4ExpOps`]) as gfx11 launches for one window of up to
//! [`super::WINDOW`] tokens, or one prompt chunk (`super::prompt`), of one sequence, on the
//! model's stream: the layer kernels (`GpuOps::gdn_mix` / `gdn_prefill`, `qsa_mix`,
//! `ple_block`, `gr_*`, `moe_*`) between device matrix products (`gpu::linear`). Buffers are the
//! session's [`Scratch`](super::scratch::Scratch).

use super::weights::{DevFfn, DevHc, DevLayer, DevMixer, DevMtp};
use super::{GpuQwen4Exp, GpuQwen4ExpSession, LayerState, WINDOW};
use crate::device::{DevicePtr, GpuError};
use crate::experts::cache::ExpertCache;
use crate::linear::{DispatchBuffers, Linear};
use crate::ops::{GdnBuffers, GluAct, PleBuffers, QsaBuffers, RowType};
use crate::upload::{DevMat, MatKind, Tmp, f32_bytes};
use cpu_executor::qwen4exp::{SwiGluCpu, team_for_each};
use model::error::{EngineError, Result};
use model::qwen4exp::moe::SwiGlu;
use model::qwen4exp::program::{self, Qwen4ExpOps, Site};
use model::qwen4exp::{Moe, Mtp};

// The MoE layer's launches (exec/moe.rs): a child module, so that it sees the window's fields.
mod moe;

fn dev(what: &'static str) -> impl FnOnce(GpuError) -> EngineError {
    move |e| EngineError::Gpu(format!("qwen4exp {what}: {e}"))
}

/// Whether a layer's routed experts can run by device dispatch (with every expert resident):
/// all in an MMVQ type, `--gpu-moe` not `host`, no routing dump (which reads the choice back).
pub(super) fn moe_on_device(opts: &crate::options::GpuOptions, m: &super::weights::DevMoe) -> bool {
    let f = &m.experts.stack;
    opts.moe != crate::options::MoePath::Host
        && !experts::trace::dumping()
        && [f.gate.kind, f.up.kind, f.down.kind].iter().all(|k| matches!(k, MatKind::Q(_)))
}

/// The rows of experts computed on the cache's CPU pool (the CPU backend's products): for each
/// `(expert, slots)`, its output for the inputs of the slots' tokens (`x` is `[token][e]`, slot
/// `j` is token `j / k`), `[slots][e]`.
pub(super) fn cpu_expert_rows(
    cache: &ExpertCache,
    experts: &[(&SwiGlu, &[usize])],
    x: &[f32],
    k: usize,
    e: usize,
) -> Vec<Vec<f32>> {
    let shared = shared_acts(experts.first().map(|f| f.0), x, e);
    cache.on_pool(|| experts.iter().map(|(f, slots)| expert_rows(f, x, slots, k, e, &shared)).collect())
}

/// Each token of `x` (`[n][e]`) quantized once for all the layer's experts (`like` is one of
/// them): what every expert the CPU computes for that token alone reads. Empty where the
/// experts' products prepare per product.
pub(super) fn shared_acts(like: Option<&SwiGlu>, x: &[f32], e: usize) -> Vec<cpu_executor::ExpertActs> {
    let Some(f) = like else { return Vec::new() };
    x.chunks_exact(e).map_while(|row| f.shared_acts(row)).collect()
}

/// One expert on the CPU for the tokens of `slots` (slot `j` is token `j / k` of `x`,
/// `[token][e]`): its rows `[slots][e]`; for one token, from its input quantized once
/// (`shared`, per token) when there.
pub(super) fn expert_rows(
    f: &SwiGlu,
    x: &[f32],
    slots: &[usize],
    k: usize,
    e: usize,
    shared: &[cpu_executor::ExpertActs],
) -> Vec<f32> {
    let mut ys = vec![0f32; slots.len() * e];
    if let Some(acts) = crate::moe::one_token(shared, slots, k) {
        f.forward_shared(acts, &mut ys);
        return ys;
    }
    let xs: Vec<f32> = slots.iter().flat_map(|&j| x[j / k * e..(j / k + 1) * e].iter().copied()).collect();
    f.forward(&xs, slots.len(), &mut ys);
    ys
}

/// The PLE rows of `toks` (advancing the sequence's n-gram history), or None without a PLE
/// block.
fn gather_ple(g: &GpuQwen4Exp, s: &mut GpuQwen4ExpSession, toks: &[u32]) -> Result<Option<Vec<f32>>> {
    let (Some(p), Some(ps)) = (&g.m.ple, s.ple.as_mut()) else { return Ok(None) };
    let layer = p.params.layer;
    p.gather(toks, &mut ps.prev, team_for_each).map(Some).map_err(|reason| EngineError::Ple { layer, reason })
}

/// How `get_rows` reads a token table stored as `t`.
/// `floats` f32 values read back from `at` (the stream must be idle).
fn read_f32(api: &dyn crate::device::GpuApi, at: DevicePtr, floats: usize, what: &'static str) -> Result<Vec<f32>> {
    let mut bytes = vec![0u8; floats * 4];
    api.memcpy_dtoh(&mut bytes, at).map_err(dev(what))?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn row_type(t: &DevMat) -> RowType {
    match t.kind {
        MatKind::Q(wt) => RowType::W(wt),
        MatKind::F16 => RowType::F16,
        _ => RowType::F32,
    }
}

/// Where a routed expert runs from on the device.
pub(super) enum Source<'a> {
    /// Its place in the layer's stacks (resident, or its cache slot): the index, the matrices.
    Device(usize, DevFfn),
    /// A slot of the staging ring, copied there from this host copy first.
    Staged(&'a SwiGlu),
}

/// One window of a device sequence.
pub(super) struct GpuQwen4ExpChunk<'a> {
    g: &'a GpuQwen4Exp,
    s: &'a mut GpuQwen4ExpSession,
    toks: &'a [u32],
    /// Launched as a graph ([`GpuQwen4ExpChunk::run`]): every launch must be the same at every
    /// position, so sizes that follow the position take their largest value.
    graph: bool,
    /// A prompt chunk (`super::prompt`): the chunked delta rule, no expert handoff.
    prompt: bool,
    /// The first row whose logits the head computes (0 in windows; the token count: none).
    first_logit: usize,
    /// The MTP head this window runs (`program::mtp_forward`; its block is layer
    /// `head.0.block`, its attention state `s.layers[0]`), or None: the trunk.
    head: Option<(&'a Mtp, &'a DevMtp)>,
    /// The PLE rows come through the feed while the window runs (`super::ple_feed`).
    ple_fed: bool,
    /// The head's logits when they ran in more passes than the logits buffer holds, each pass
    /// read back (rows `first_logit..n`; empty otherwise: they are in `sc.logits`).
    logits_read: Vec<f32>,
}

/// Where a window's PLE rows come from ([`GpuQwen4ExpChunk::new`]).
pub(super) enum PleRows {
    /// Gathered while the previous prompt chunk ran.
    Gathered(Vec<f32>),
    /// Gathered now, before the launches.
    Now,
    /// Read by a host thread while the window runs, received at the PLE layer (`super::ple_feed`;
    /// the row ids already advanced the n-gram history).
    Fed,
}

impl<'a> GpuQwen4ExpChunk<'a> {
    /// Uploads the window's inputs (after the previous window's launches are done with the
    /// buffers): token ids, positions and the PLE rows for these tokens (`ple_rows`: gathered
    /// already while the previous window ran, gathered now, or fed while this one runs).
    pub(super) fn new(
        g: &'a GpuQwen4Exp,
        s: &'a mut GpuQwen4ExpSession,
        toks: &'a [u32],
        graph: bool,
        ple_rows: PleRows,
    ) -> Result<GpuQwen4ExpChunk<'a>> {
        if toks.len() > s.sc.cols {
            return Err(EngineError::Gpu(format!(
                "qwen4exp: a step of {} tokens, the session's buffers hold {}",
                toks.len(),
                s.sc.cols
            )));
        }
        let fed = matches!(ple_rows, PleRows::Fed);
        let rows = match ple_rows {
            PleRows::Gathered(r) => Some(r),
            PleRows::Now => gather_ple(g, s, toks)?,
            PleRows::Fed => None,
        };
        let api = g.api();
        api.stream_synchronize(&g.res.stream).map_err(dev("synchronize"))?;
        let pos: Vec<u32> = (s.n_past..s.n_past + toks.len()).map(|p| p as u32).collect();
        let b = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        api.memcpy_htod(s.sc.ids, &b(toks)).map_err(dev("uploading token ids"))?;
        api.memcpy_htod(s.sc.pos, &b(&pos)).map_err(dev("uploading positions"))?;
        if let Some(emb) = rows {
            api.memcpy_htod(s.sc.emb, f32_bytes(&emb)).map_err(dev("uploading PLE rows"))?;
        }
        Ok(GpuQwen4ExpChunk {
            g,
            s,
            toks,
            graph,
            prompt: false,
            first_logit: 0,
            head: None,
            ple_fed: fed,
            logits_read: Vec::new(),
        })
    }

    /// Runs these tokens as a prompt chunk (`super::prompt`): eagerly, the chunked delta rule,
    /// the prompt rule of the products, routed experts without the handoff, and the head only
    /// for the rows from `first_logit` (none when it is the chunk's length).
    pub(super) fn prompt_chunk(mut self, first_logit: usize) -> Self {
        self.prompt = true;
        self.graph = false;
        self.first_logit = first_logit.min(self.toks.len());
        self
    }

    /// The PLE rows of the window after this one (`toks`), gathered on the host while this
    /// window's launches run (`Ple::gather`: row ids, row cache, SSD reads).
    pub(super) fn gather_next(&mut self, toks: &[u32]) -> Result<Option<Vec<f32>>> {
        gather_ple(self.g, self.s, toks)
    }

    /// A window of the MTP head (`s` is a head session): the trunk's wide residuals `wide`
    /// (`[n][hc][E]`) are uploaded with the tokens; a graph per window size when `graph`.
    pub(super) fn for_head(
        g: &'a GpuQwen4Exp,
        s: &'a mut GpuQwen4ExpSession,
        toks: &'a [u32],
        wide: &[f32],
        head: (&'a Mtp, &'a DevMtp),
        graph: bool,
    ) -> Result<GpuQwen4ExpChunk<'a>> {
        let mut c = GpuQwen4ExpChunk::new(g, s, toks, graph, PleRows::Now)?;
        g.api().memcpy_htod(c.s.sc.wide, f32_bytes(wide)).map_err(dev("uploading the MTP head's wide residuals"))?;
        c.head = Some(head);
        Ok(c)
    }

    /// A chained step of the MTP head: one token whose wide residual is the head's own output
    /// streams of row `from_row` of its previous window, copied on the device (nothing crosses
    /// to the host).
    pub(super) fn for_head_chained(
        g: &'a GpuQwen4Exp,
        s: &'a mut GpuQwen4ExpSession,
        toks: &'a [u32],
        from_row: usize,
        head: (&'a Mtp, &'a DevMtp),
        graph: bool,
    ) -> Result<GpuQwen4ExpChunk<'a>> {
        let w = (g.m.hp.hc * g.m.hp.n_embd) * 4;
        let c = GpuQwen4ExpChunk::new(g, s, toks, graph, PleRows::Now)?;
        g.api()
            .memcpy_dtod_async(&g.res.stream, c.s.sc.wide, c.s.sc.r + (from_row * w) as u64, w)
            .map_err(dev("chaining the MTP head's streams"))?;
        Ok(GpuQwen4ExpChunk { head: Some(head), ..c })
    }

    /// [`GpuQwen4ExpChunk::finish`] for a draft step: the last row's greedy token and its
    /// probability (`logits_top` on the device), 8 bytes read back instead of the logits.
    pub(super) fn finish_top(self) -> Result<(u32, f32)> {
        let (g, n, v) = (self.g, self.toks.len(), self.g.m.hp.n_vocab);
        let sc = &self.s.sc;
        let last = (n - 1)
            .checked_sub(self.first_logit)
            .filter(|_| self.logits_read.is_empty())
            .ok_or_else(|| EngineError::Gpu("qwen4exp: a draft step's last row has no logits on the device".into()))?;
        g.res
            .ops
            .logits_top(&g.res.stream, sc.logits + (last * v * 4) as u64, sc.top, v as u32, 1)
            .map_err(dev("draft token"))?;
        let api = g.api();
        api.stream_synchronize(&g.res.stream).map_err(dev("synchronize"))?;
        let mut b = [0u8; 8];
        api.memcpy_dtoh(&mut b, sc.top).map_err(dev("reading the draft token"))?;
        self.s.n_past += n;
        Ok((u32::from_le_bytes([b[0], b[1], b[2], b[3]]), f32::from_le_bytes([b[4], b[5], b[6], b[7]])))
    }

    /// The device weights of layer `layer` (the head's block when running the head).
    fn layer(&self, layer: usize) -> &'a DevLayer {
        match self.head {
            Some((h, d)) if layer == h.block => &d.layer,
            _ => &self.g.w.layers[layer],
        }
    }

    /// The host weights of layer `layer`'s MoE.
    fn host_moe(&self, layer: usize) -> &'a Moe {
        match self.head {
            Some((h, _)) if layer == h.block => &h.moe,
            _ => &self.g.m.layers[layer].moe,
        }
    }

    /// The sequence state of layer `layer` (a head session holds only the head's).
    fn state(&self, layer: usize) -> Option<&LayerState> {
        match self.head {
            Some((h, _)) => self.s.layers.first().filter(|_| layer == h.block),
            None => self.s.layers.get(layer),
        }
    }

    /// The expert cache of the trunk's MoE layers (the head's experts are all resident).
    fn cache(&self) -> Option<&'a ExpertCache> {
        if self.head.is_some() { None } else { self.g.res.expert_cache.as_ref() }
    }

    /// The window's launches: the program, eagerly, or as a graph captured once per window size
    /// and replayed (its inputs are in device buffers).
    pub(super) fn run(&mut self) -> Result<()> {
        let g = self.g;
        let program = |c: &mut Self| match c.head {
            Some((h, _)) => program::mtp_forward(c, h),
            None => program::forward(c, &g.m),
        };
        if !self.graph {
            self.s.eager_windows += 1;
            return program(self);
        }
        let (api, st, n) = (g.api(), &g.res.stream, self.n());
        if let Some((_, graph)) = self.s.graphs.iter().find(|(k, _)| *k == n) {
            self.s.graph_replays += 1;
            return api.launch_graph(graph, st).map_err(dev("graph replay"));
        }
        api.begin_capture(st).map_err(dev("graph capture"))?;
        let recorded = program(self);
        let graph = api.end_capture(st);
        recorded?;
        let graph = graph.map_err(dev("graph capture"))?;
        api.launch_graph(&graph, st).map_err(dev("graph replay"))?;
        self.s.graphs.push((n, graph));
        self.s.graph_replays += 1;
        Ok(())
    }

    /// Waits for the window, advances the sequence and returns its logits `[n][n_vocab]` (the
    /// last row only unless `all`) and, when `hidden`, the wide residuals `R` after the last
    /// layer `[n][hc][E]` (what the MTP head reads; the head's own output when running it).
    pub(super) fn finish(self, all: bool, hidden: bool) -> Result<(Vec<f32>, Vec<f32>)> {
        let api = self.g.api();
        api.stream_synchronize(&self.g.res.stream).map_err(dev("synchronize"))?;
        if let Some(p) = self.s.profile.as_mut() {
            p.tokens += self.toks.len() as u64;
        }
        let (n, v) = (self.toks.len(), self.g.m.hp.n_vocab);
        let read = |at: DevicePtr, floats: usize, what: &'static str| read_f32(&**api, at, floats, what);
        // Row i of the head's output is token `first_logit + i` (none when it ran no rows).
        let (r0, first) = (self.first_logit, if all { self.first_logit } else { n - 1 });
        let logits = if first < r0 || first >= n {
            Vec::new()
        } else if !self.logits_read.is_empty() {
            self.logits_read[(first - r0) * v..].to_vec()
        } else {
            read(self.s.sc.logits + ((first - r0) * v * 4) as u64, (n - first) * v, "reading logits")?
        };
        let wide = if hidden {
            read(self.s.sc.r, n * self.g.m.hp.hc * self.g.m.hp.n_embd, "reading the wide residuals")?
        } else {
            Vec::new()
        };
        self.s.n_past += n;
        Ok((logits, wide))
    }

    fn n(&self) -> usize {
        self.toks.len()
    }

    /// Adds the device counters since the last call to `part` with the bytes it must move at
    /// least (profiling only: the software device counts every instruction and byte).
    fn count(&mut self, part: &'static str, ideal: usize) {
        if let Some(p) = self.s.profile.as_mut() {
            let s = self.g.api().take_stats().unwrap_or_default();
            let e = p.parts.entry(part).or_default();
            e.launches += s.launches;
            e.instructions += s.instructions;
            e.global_bytes += s.global_bytes_read + s.global_bytes_written;
            e.ideal_bytes += ideal as u64;
        }
    }

    /// f32 bytes of `values` per token of the window.
    fn act(&self, values: usize) -> usize {
        4 * values * self.n()
    }

    fn lin(&self) -> Linear<'_> {
        let sc = &self.s.sc;
        Linear {
            ops: &self.g.res.ops,
            stream: &self.g.res.stream,
            opts: &self.g.res.opts,
            lt: None,
            xo: sc.xo,
            dequant_scratch_bytes: sc.wdq_bytes,
        }
    }

    /// `y[rows] = W x[cols]` for `n` rows of `x`; the input is quantized first for an MMVQ
    /// weight.
    fn mm(&self, w: &DevMat, x: DevicePtr, n: usize, y: DevicePtr) -> Result<()> {
        self.project(x, n, &[(w, y)])
    }

    /// Several products of one input, quantized once. A prompt chunk's products may stage a
    /// dequantized matrix in `wdq` (the prompt rule of `gpu::linear`); windows never do.
    fn project(&self, x: DevicePtr, n: usize, outs: &[(&DevMat, DevicePtr)]) -> Result<()> {
        self.project_with(x, n, outs, self.wdq())
    }

    /// The dequantized-matrix staging of this step's products: a prompt chunk's, none in windows
    /// (whose products stay as they were, whatever `--gpu-prefill` says).
    fn wdq(&self) -> DevicePtr {
        if self.prompt { self.s.sc.wdq } else { 0 }
    }

    fn project_with(&self, x: DevicePtr, n: usize, outs: &[(&DevMat, DevicePtr)], wdq: DevicePtr) -> Result<()> {
        self.project_from(x, n, outs, wdq, false)
    }

    /// Whether one of the products `outs` of `n` rows reads the input as Q8_1 (`sc.xq`): then
    /// a kernel that writes the input may write its quantization too ([`GpuQwen4ExpChunk::project_from`]).
    fn reads_q8_1(&self, n: usize, outs: &[(&DevMat, DevicePtr)], wdq: DevicePtr) -> bool {
        let (lin, tmp) = (self.lin(), Tmp { wdq, xh: self.s.sc.xh });
        outs.iter().any(|(w, _)| lin.reads_q8_1(w, n, tmp))
    }

    /// [`GpuQwen4ExpChunk::project_with`]; `quantized`: the input's Q8_1 rows are in `sc.xq` already
    /// (written with it by the kernel that produced it).
    fn project_from(
        &self,
        x: DevicePtr,
        n: usize,
        outs: &[(&DevMat, DevicePtr)],
        wdq: DevicePtr,
        quantized: bool,
    ) -> Result<()> {
        let lin = self.lin();
        let sc = &self.s.sc;
        let tmp = Tmp { wdq, xh: sc.xh };
        // Quantized once for the products that read Q8_1 (none when all take the GEMM path).
        if !quantized && let Some((w, _)) = outs.iter().find(|(w, _)| lin.reads_q8_1(w, n, tmp)) {
            lin.quantize(x, sc.xq, n, w.cols).map_err(dev("quantizing activations"))?;
        }
        for (w, y) in outs {
            lin.matmul(w, 0, x, sc.xq, n, *y, tmp).map_err(dev("matrix product"))?;
        }
        Ok(())
    }

    /// The GR read of `h` from the streams into `x` (and `inj` when it injects).
    fn hc_read(&self, h: &DevHc) -> Result<()> {
        self.hc_read_rows(h, 0, self.n(), self.wdq())
    }

    /// The GR read of the `n` tokens from `r0` (their streams) into rows `0..n` of `x` / `inj`;
    /// `wdq` as in [`GpuQwen4ExpChunk::project_with`]. When the products read Q8_1 (MMVQ), the norm
    /// and the low-rank activation write their outputs' quantization as well, and the down and
    /// injection products share the streams' (5 launches a read, 6 with the injection).
    fn hc_read_rows(&self, h: &DevHc, r0: usize, n: usize, wdq: DevicePtr) -> Result<()> {
        let (ops, st, sc) = (&self.g.res.ops, &self.g.res.stream, &self.s.sc);
        let r = sc.r + (r0 * (h.shape.hc * h.shape.e) as usize * 4) as u64;
        let from_flat: Vec<(&DevMat, DevicePtr)> =
            std::iter::once((&h.down, sc.lo)).chain(h.inject.as_ref().map(|inj| (inj, sc.inj))).collect();
        let flat_q = self.reads_q8_1(n, &from_flat, wdq) && h.shape.e.is_multiple_of(32);
        ops.gr_stream_norm(st, &h.shape, r, h.norm, sc.flat, flat_q.then_some(sc.xq), n as u32)
            .map_err(dev("GR norm"))?;
        self.project_from(sc.flat, n, &from_flat, wdq, flat_q)?;
        let lr = h.down.rows;
        let up = [(&h.up, sc.gates)];
        let lo_q = self.reads_q8_1(n, &up, wdq) && lr.is_multiple_of(32);
        ops.gr_lowrank_act(st, &h.shape, sc.lo, lo_q.then_some((sc.xq, lr as u32)), (n * lr) as u32)
            .map_err(dev("GR low-rank"))?;
        self.project_from(sc.lo, n, &up, wdq, lo_q)?;
        ops.gr_gate_mix(st, &h.shape, sc.flat, sc.gates, sc.x, n as u32).map_err(dev("GR gate mix"))
    }

    fn hc(&self, layer: usize, site: Site) -> &'a DevHc {
        let l = self.layer(layer);
        if site == Site::Mixer { &l.hc_attn } else { &l.hc_ffn }
    }

    /// `y = down(silu(gate x) ⊙ up x)` of one expert for `n` rows of `x`.
    fn swiglu(&self, f: &DevFfn, x: DevicePtr, n: usize, bufs: [DevicePtr; 3], y: DevicePtr) -> Result<()> {
        self.swiglu_with(f, x, n, bufs, y, self.wdq())
    }

    /// [`GpuQwen4ExpChunk::swiglu`] with `wdq` as in [`GpuQwen4ExpChunk::project_with`].
    fn swiglu_with(
        &self,
        f: &DevFfn,
        x: DevicePtr,
        n: usize,
        bufs: [DevicePtr; 3],
        y: DevicePtr,
        wdq: DevicePtr,
    ) -> Result<()> {
        let [g, u, a] = bufs;
        self.project_with(x, n, &[(&f.gate, g), (&f.up, u)], wdq)?;
        self.g
            .res
            .ops
            .glu(&self.g.res.stream, g, u, a, (n * f.gate.rows) as u32, GluAct::Silu)
            .map_err(dev("SwiGLU"))?;
        self.project_with(a, n, &[(&f.down, y)], wdq)
    }
}

impl Qwen4ExpOps for GpuQwen4ExpChunk<'_> {
    fn embed(&mut self) -> Result<()> {
        let (g, sc, n) = (self.g, &self.s.sc, self.n());
        let (e, hc) = (g.m.hp.n_embd, g.m.hp.hc);
        let t = &g.w.tok_embd;
        g.res
            .ops
            .get_rows(&g.res.stream, row_type(t), t.ptr, sc.ids, n as u32, e as u32, sc.x, 1.0)
            .map_err(dev("embedding rows"))?;
        let api = g.api();
        for i in 0..n {
            for c in 0..hc {
                let dst = sc.r + (((i * hc + c) * e) * 4) as u64;
                api.memcpy_dtod_async(&g.res.stream, dst, sc.x + ((i * e) * 4) as u64, e * 4)
                    .map_err(dev("residual streams"))?;
            }
        }
        // The rows read and the block input written (the stream copies are not kernel
        // launches, so the counters do not see them).
        let row = t.mat_bytes / t.rows.max(1);
        self.count("embed", n * row + self.act(e));
        Ok(())
    }

    fn ple(&mut self, _layer: usize) -> Result<()> {
        let (g, n) = (self.g, self.n());
        let (Some(_), Some(dp)) = (&g.m.ple, &g.w.ple) else { return Ok(()) };
        // The rows were uploaded with the window's inputs (`GpuQwen4ExpChunk::new`), or are fed now.
        let Some(hist) = self.s.ple.as_ref().map(|ps| ps.hist) else { return Ok(()) };
        let sc = &self.s.sc;
        if self.ple_fed {
            let feed =
                g.ple_feed.as_ref().ok_or_else(|| EngineError::Gpu("qwen4exp: PLE rows fed without a feed".into()))?;
            feed.receive(&**g.api(), &g.res.stream, sc.emb, n, g.m.hp.n_embd).map_err(dev("PLE rows"))?;
        }
        self.project(sc.emb, n, &[(&dp.key, sc.pkey), (&dp.value, sc.pval)])?;
        let b = PleBuffers {
            key: sc.pkey,
            val: sc.pval,
            r: sc.r,
            norms: dp.norms,
            taps: dp.taps,
            hist,
            gv: sc.gv,
            nn: sc.nn,
        };
        g.res.ops.ple_block(&g.res.stream, &dp.shape, &b, n as u32).map_err(dev("PLE block"))?;
        let hce = (dp.shape.hc * dp.shape.e) as usize;
        self.count(
            "ple",
            dp.key.mat_bytes
                + dp.value.mat_bytes
                + 2 * dp.shape.hist_len() * 4
                + self.act(2 * hce + dp.shape.e as usize),
        );
        Ok(())
    }

    fn hc_mix(&mut self, layer: usize, site: Site) -> Result<()> {
        let h = self.hc(layer, site);
        self.hc_read(h)?;
        let hce = (h.shape.hc * h.shape.e) as usize;
        let w = h.down.mat_bytes + h.up.mat_bytes + h.inject.as_ref().map_or(0, |m| m.mat_bytes);
        self.count("gr read", w + self.act(hce + h.shape.e as usize));
        Ok(())
    }

    fn gdn(&mut self, layer: usize) -> Result<()> {
        let (g, n) = (self.g, self.n());
        let (DevMixer::Gdn(d), Some(LayerState::Gdn { conv, delta, .. })) =
            (&self.layer(layer).mixer, self.state(layer))
        else {
            return Err(EngineError::StateMismatch { layer });
        };
        let sc = &self.s.sc;
        self.project(sc.x, n, &[(&d.qkv, sc.m), (&d.gate, sc.z), (&d.beta, sc.beta), (&d.alpha, sc.alpha)])?;
        // The gated norm writes the output product's Q8_1 input too when it reads one (MMVQ).
        let out = [(&d.out, sc.y)];
        let out_q = !g.res.opts.ordered && self.reads_q8_1(n, &out, self.wdq()) && d.shape.head_dim.is_multiple_of(32);
        let b = GdnBuffers {
            m: sc.m,
            z: sc.z,
            beta: sc.beta,
            alpha: sc.alpha,
            taps: d.taps,
            dt_bias: d.dt_bias,
            ssm_a: d.ssm_a,
            norm: d.norm,
            conv_state: *conv,
            delta_state: *delta,
            u: sc.u,
            o: sc.o,
            o_q8_1: if out_q { sc.xq } else { 0 },
        };
        if g.res.opts.ordered {
            g.res.ops.gdn_mix_in_order(&g.res.stream, &d.shape, &b, n as u32).map_err(dev("GDN mixer"))?;
        } else if self.prompt {
            g.res
                .ops
                .gdn_prefill(&g.res.stream, &d.shape, &b, n as u32, crate::abi::GDN_CHUNK_MAX, sc.gdn_delta)
                .map_err(dev("GDN mixer (chunked)"))?;
        } else {
            g.res.ops.gdn_mix(&g.res.stream, &d.shape, &b, n as u32).map_err(dev("GDN mixer"))?;
        }
        self.project_from(sc.o, n, &out, self.wdq(), out_q)?;
        let w = [&d.qkv, &d.gate, &d.beta, &d.alpha, &d.out].iter().map(|m| m.mat_bytes).sum::<usize>();
        let state = 2 * 4 * (d.shape.conv_state_len() + d.shape.delta_state_len());
        let e = g.m.hp.n_embd;
        self.count("gdn", w + state + self.act(2 * e));
        Ok(())
    }

    fn attention(&mut self, layer: usize) -> Result<()> {
        let (g, n) = (self.g, self.n());
        let (DevMixer::Attn(a), Some(LayerState::Attn { k, v, kappa, k_scale, v_scale, kappa_scale, blocks, rope })) =
            (&self.layer(layer).mixer, self.state(layer))
        else {
            return Err(EngineError::StateMismatch { layer });
        };
        let sc = &self.s.sc;
        let mut outs = vec![(&a.q, sc.qf), (&a.k, sc.kp), (&a.v, sc.vp)];
        if let Some((iq, ik)) = &a.ix {
            outs.extend([(iq, sc.iq_p), (ik, sc.kappa_p)]);
        }
        self.project(sc.x, n, &outs)?;
        let shape = crate::ops::QsaShape { kv: self.s.kv, ..a.shape };
        let b = QsaBuffers {
            qf: sc.qf,
            kp: sc.kp,
            vp: sc.vp,
            kappa_p: sc.kappa_p,
            iq_p: sc.iq_p,
            q_norm: a.q_norm,
            k_norm: a.k_norm,
            iq_norm: a.iq_norm,
            ik_norm: a.ik_norm,
            rope_table: *rope,
            pos: sc.pos,
            k_cache: *k,
            v_cache: *v,
            kappa_cache: *kappa,
            k_scale: *k_scale,
            v_scale: *v_scale,
            kappa_scale: *kappa_scale,
            blocks: *blocks,
            q: sc.q,
            k: sc.k,
            iq: sc.iq,
            score: sc.score,
            sel: sc.sel,
            sel_n: sc.sel_n,
            out: sc.att,
        };
        // A graph is replayed at every position: its attention launch is sized for a full cache.
        let start = if self.graph { self.s.capacity - n } else { self.s.n_past };
        g.res
            .ops
            .qsa_mix(&g.res.stream, &shape, &b, n as u32, start as u32, self.s.capacity as u32)
            .map_err(dev("QSA attention"))?;
        self.mm(&a.o, sc.att, n, sc.y)?;
        // Weights once, each token's kept K and V rows once (and the new ones written).
        let mut w = [&a.q, &a.k, &a.v, &a.o].iter().map(|m| m.mat_bytes).sum::<usize>();
        w += a.ix.as_ref().map_or(0, |(q, k)| q.mat_bytes + k.mat_bytes);
        let esz = if self.s.kv == crate::ops::KvFormat::Int8 { 1 } else { 2 };
        let row = (a.shape.n_head_kv * a.shape.head_dim) as usize * esz;
        let cells: usize = (0..n)
            .map(|t| {
                let visible = self.s.n_past + t + 1;
                a.shape.indexer.map_or(visible, |ix| visible.min(ix.budget() as usize))
            })
            .sum();
        let e = g.m.hp.n_embd;
        self.count("qsa", w + 2 * row * (cells + n) + self.act(2 * e));
        Ok(())
    }

    fn hc_combine(&mut self, layer: usize, site: Site) -> Result<()> {
        let (g, sc, n) = (self.g, &self.s.sc, self.n());
        let shape = self.hc(layer, site).shape;
        g.res.ops.gr_combine(&g.res.stream, &shape, sc.r, sc.y, sc.inj, n as u32).map_err(dev("GR combine"))?;
        let hce = (shape.hc * shape.e) as usize;
        self.count("gr write", self.act(2 * hce + shape.e as usize + shape.hc as usize));
        Ok(())
    }

    fn moe(&mut self, layer: usize) -> Result<()> {
        self.moe_layer(layer)
    }

    fn end_layer(&mut self, layer: usize) -> Result<()> {
        let Some(t) = self.s.trace.as_mut() else { return Ok(()) };
        let (api, floats) = (self.g.api(), self.toks.len() * self.g.m.hp.hc * self.g.m.hp.n_embd);
        api.stream_synchronize(&self.g.res.stream).map_err(dev("synchronize"))?;
        let rows = read_f32(&**api, self.s.sc.r, floats, "reading the trace")?;
        if t.len() <= layer {
            t.resize(layer + 1, Vec::new());
        }
        t[layer].extend(rows);
        Ok(())
    }

    /// The head of the rows from `self.first_logit` (a prompt chunk's rows whose logits nobody
    /// reads are skipped: all of a chunk before the last one unless every row's logits are
    /// wanted) into rows `0..` of `sc.logits`, in passes of at most its `logit_rows` rows (each
    /// read back when there is more than one: a long chunk's logits would not fit the device).
    /// Its products take the decode rule (never staged dequantized, as the shared decoder's
    /// head), so a row's logits do not depend on how many rows ran with it.
    fn head(&mut self) -> Result<()> {
        let (g, n, r0) = (self.g, self.n(), self.first_logit);
        if r0 >= n {
            return Ok(());
        }
        let (v, rows) = (g.m.hp.n_vocab, self.s.sc.logit_rows());
        let passes = n - r0 > rows;
        for b0 in (r0..n).step_by(rows) {
            let (nb, sc) = ((n - b0).min(rows), &self.s.sc);
            self.hc_read_rows(&g.w.out_hc, b0, nb, 0)?;
            self.project_with(sc.x, nb, &[(&g.w.output, sc.logits)], 0)?;
            if passes {
                let api = g.api();
                api.stream_synchronize(&g.res.stream).map_err(dev("synchronize"))?;
                self.logits_read.extend(read_f32(&**api, sc.logits, nb * v, "reading logits")?);
            }
        }
        let h = &g.w.out_hc;
        let w = h.down.mat_bytes + h.up.mat_bytes + g.w.output.mat_bytes;
        self.count("head", w + 4 * (n - r0) * ((h.shape.hc * h.shape.e) as usize + v));
        Ok(())
    }

    fn mtp_input(&mut self) -> Result<()> {
        let (g, sc, n) = (self.g, &self.s.sc, self.n());
        let Some((h, d)) = self.head else {
            return Err(EngineError::Unsupported("the MTP head's input outside a head window".into()));
        };
        let (e, hc, api, st) = (h.n_embd, h.hc, g.api(), &g.res.stream);
        // x = embedding rows, y = enorm(x), flat = hnorm_c of each wide stream.
        let t = d.embed.as_ref().unwrap_or(&g.w.tok_embd);
        g.res
            .ops
            .get_rows(st, row_type(t), t.ptr, sc.ids, n as u32, e as u32, sc.x, 1.0)
            .map_err(dev("MTP embedding rows"))?;
        g.res.ops.gr_stream_norm(st, &d.enorm_shape, sc.x, d.enorm, sc.y, None, n as u32).map_err(dev("MTP enorm"))?;
        g.res
            .ops
            .gr_stream_norm(st, &d.hnorm_shape, sc.wide, d.hnorm, sc.flat, None, n as u32)
            .map_err(dev("MTP hnorm"))?;
        // Per stream: cat[t] = [y[t] ‖ flat[t][c]], R[t][c] = W_eh · cat[t].
        let at = |p: DevicePtr, floats: usize| p + (floats * 4) as u64;
        for c in 0..hc {
            for t in 0..n {
                api.memcpy_dtod_async(st, at(sc.cat, 2 * t * e), at(sc.y, t * e), e * 4)
                    .map_err(dev("MTP input rows"))?;
                api.memcpy_dtod_async(st, at(sc.cat, (2 * t + 1) * e), at(sc.flat, (t * hc + c) * e), e * 4)
                    .map_err(dev("MTP input rows"))?;
            }
            self.mm(&d.eh_proj, sc.cat, n, sc.proj)?;
            for t in 0..n {
                api.memcpy_dtod_async(st, at(sc.r, (t * hc + c) * e), at(sc.proj, t * e), e * 4)
                    .map_err(dev("MTP residual streams"))?;
            }
        }
        Ok(())
    }

    fn mtp_head(&mut self) -> Result<()> {
        let (g, n) = (self.g, self.n());
        let Some((_, d)) = self.head else {
            return Err(EngineError::Unsupported("the MTP head's output outside a head window".into()));
        };
        self.hc_read(d.hc_head.as_ref().unwrap_or(&g.w.out_hc))?;
        self.mm(d.head.as_ref().unwrap_or(&g.w.output), self.s.sc.x, n, self.s.sc.logits)
    }
}
