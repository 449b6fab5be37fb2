//! A window's MoE layer on the device ([`GpuQwen4ExpChunk::moe_layer`]): the router and the shared
//! expert's products from one quantization of the input, then the routed experts by device
//! dispatch (sorted by expert in a prompt chunk), through the expert cache's per-layer handoff,
//! or from the ids read back (host dispatch: cache slots, the staging ring, the CPU pool), the
//! combine in rank order and the sigmoid-gated shared expert.
use super::*;
use crate::moe::{Chosen, HandoffBuffers, Runs, distinct, experts_by_handoff, place_chosen, read_choice};

impl GpuQwen4ExpChunk<'_> {
    /// A MoE layer: the router and shared expert's products, the routed experts by device
    /// dispatch, through the expert handoff, or from the ids read back (host dispatch), the
    /// combine and the shared expert.
    pub(super) fn moe_layer(&mut self, layer: usize) -> Result<()> {
        let (g, sc, n) = (self.g, &self.s.sc, self.n());
        let (e, m, host) = (g.m.hp.n_embd, &self.layer(layer).moe, self.host_moe(layer));
        let (k, ne) = (m.n_used, host.experts.len());
        let x_quantized = self.moe_inputs(m)?;
        g.res
            .ops
            .moe_router(&g.res.stream, sc.rlog, sc.rids, sc.rw, n as u32, ne as u32, k as u32, true)
            .map_err(dev("MoE router"))?;
        let ffn = |f: &DevFfn| f.gate.mat_bytes + f.up.mat_bytes + f.down.mat_bytes;
        if self.moe_on_device(m) {
            let map = self.experts_on_device(m, x_quantized)?;
            return self.moe_tail(layer, map, |this| {
                Ok(if this.s.profile.is_some() { this.distinct_experts(k, ne)? * ffn(&m.experts.stack) } else { 0 })
            });
        }
        if let (Some(h), Some(cache), true) = (&g.res.handoff, self.cache(), !self.prompt && g.by_handoff(self.s)) {
            // Hits from their slots by device dispatch, misses from the host thread.
            let lin = self.lin();
            if !x_quantized {
                lin.quantize(sc.x, sc.xq, n, e).map_err(dev("quantizing the MoE input"))?;
            }
            let b = HandoffBuffers {
                ids: sc.rids,
                x: sc.x,
                slots: sc.rslots,
                map: sc.hmap,
                miss_base: WINDOW * k,
                dispatch: self.dispatch_buffers(sc.rids),
            };
            let f = &m.experts.stack;
            experts_by_handoff(&lin, h, cache, layer, n, [k, ne, e], [&f.gate, &f.up, &f.down], &b)
                .map_err(dev("routed experts (expert handoff)"))?;
            return self.moe_tail(layer, sc.hmap, |_| Ok(0));
        }
        // The routed experts' products, launched from the ids read back (host dispatch).
        let api = g.api();
        let sel = read_choice(&**api, &g.res.stream, sc.rids, n, k, ne).map_err(dev("reading expert ids"))?;
        let chosen = place_chosen(&sel, ne, layer, self.cache(), g.res.staging.is_some(), self.prompt, |id, s| {
            m.experts
                .fill(&**api, &host.experts[id], s)
                .map_err(|w| EngineError::Gpu(format!("qwen4exp layer {layer}: copying expert {id} to slot {s}: {w}")))
        })?;
        let mut expert_bytes = 0;
        // The experts without a slot, run on the CPU once the device's are launched.
        let mut on_cpu: Vec<(&SwiGlu, &[usize])> = Vec::new();
        // A prompt chunk's device experts, run together once placed.
        let mut grouped: Vec<(Source<'_>, &[usize])> = Vec::new();
        for Chosen { expert: id, slots, runs } in &chosen {
            let no_copy = || EngineError::Gpu(format!("qwen4exp MoE layer {layer}: no device copy of expert {id}"));
            // The device copy to run from: resident or a cache slot, the staging ring, or none
            // (on the CPU).
            let src = match *runs {
                Runs::Device(s) => Source::Device(s, m.experts.get(s).ok_or_else(no_copy)?),
                Runs::Staged => Source::Staged(&host.experts[*id]),
                Runs::Cpu => {
                    on_cpu.push((&host.experts[*id], slots));
                    continue;
                }
            };
            expert_bytes += m.experts.one_bytes();
            if self.prompt {
                grouped.push((src, slots));
                continue;
            }
            self.run_expert(&m.experts, &src, |f| {
                slots.iter().try_for_each(|&slot| {
                    let (t, y) = (slot / k, sc.ys + ((slot * e) * 4) as u64);
                    self.swiglu(f, sc.x + ((t * e) * 4) as u64, 1, [sc.eg, sc.eu, sc.ea], y)
                })
            })?;
        }
        if self.prompt {
            self.experts_grouped(m, &grouped, k, x_quantized)?;
        }
        if let Some(cache) = self.cache() {
            self.experts_on_cpu(cache, &on_cpu, k)?;
        }
        self.moe_tail(layer, if self.prompt { sc.hmap } else { sc.map }, |_| Ok(expert_bytes))
    }

    /// A prompt chunk's routed experts from the ids read back, each on the tokens that chose it
    /// at once, so each expert's weights are read once a chunk rather than once a token: expert
    /// `experts[i]` with its slots (`token·k + rank`). Outputs land in the upper half of `sc.ys`,
    /// expert after expert; the combine's map (`sc.hmap`) sends every slot to its row there, and
    /// the slots of the CPU's experts to their own rows (where `experts_on_cpu` writes). The
    /// products take the prompt rule. The experts in the stacks whose products stay MMVQ (fewer
    /// than GEMM_MIN_TOKENS tokens, the usual case: 640 slots over ~365 of 512 experts) run
    /// together by device dispatch over the list of their rows (`Linear::experts_listed`: a few
    /// launches for all of them, where a launch group each would be ~6 launches an expert); the
    /// others one by one (rows gathered by `get_rows`): dequantize + GEMM or MMQ from
    /// GEMM_MIN_TOKENS tokens, and the misses streamed through the staging ring
    /// ([`GpuQwen4ExpChunk::run_expert`]).
    fn experts_grouped(
        &self,
        m: &super::super::weights::DevMoe,
        experts: &[(Source<'_>, &[usize])],
        k: usize,
        x_quantized: bool,
    ) -> Result<()> {
        let (g, sc, n, e) = (self.g, &self.s.sc, self.n(), self.g.m.hp.n_embd);
        let (api, stacks, lin) = (g.api(), &m.experts, self.lin());
        let tmp = Tmp { wdq: self.wdq(), xh: sc.xh };
        let listed = |src: &Source<'_>, cnt: usize| {
            matches!(src, Source::Device(..))
                && super::moe_on_device(&self.g.res.opts, m)
                && lin.is_mmvq(&stacks.stack.gate, cnt, tmp)
                && lin.is_mmvq(&stacks.stack.down, cnt, tmp)
        };
        // The listed experts' rows first, then the others' (decided once an expert).
        let (first, rest): (Vec<_>, Vec<_>) = experts.iter().partition(|(s, sl)| listed(s, sl.len()));
        let base = sc.cols * k;
        let mut map: Vec<u32> = (0..(n * k) as u32).collect();
        let mut rows: Vec<u32> = Vec::with_capacity(n * k);
        for (_, slots) in first.iter().chain(&rest) {
            for &j in slots.iter() {
                map[j] = (base + rows.len()) as u32;
                rows.push((j / k) as u32);
            }
        }
        // The listed rows' experts: their places in the stacks.
        let ids: Vec<u32> = first
            .iter()
            .filter_map(|(src, slots)| match src {
                Source::Device(s, _) => Some(std::iter::repeat_n(*s as u32, slots.len())),
                Source::Staged(_) => None,
            })
            .flatten()
            .collect();
        let b = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // The stream is idle (synchronized to read the ids), so nothing reads these buffers.
        api.memcpy_htod(sc.rslots, &b(&rows)).map_err(dev("uploading expert token lists"))?;
        api.memcpy_htod(sc.hmap, &b(&map)).map_err(dev("uploading the combine map"))?;
        if !ids.is_empty() {
            api.memcpy_htod(sc.order.ids, &b(&ids)).map_err(dev("uploading expert slots"))?;
            if !x_quantized {
                lin.quantize(sc.x, sc.xq, n, e).map_err(dev("quantizing the MoE input"))?;
            }
            let f = &stacks.stack;
            let db = DispatchBuffers {
                ids: sc.order.ids,
                xq: sc.xq,
                act: sc.da,
                act_q: sc.daq,
                gate: sc.dg,
                up: sc.du,
                y: sc.ys + (base * e * 4) as u64,
            };
            lin.experts_listed([&f.gate, &f.up, &f.down], stacks.n, ids.len(), sc.order.ids, sc.rslots, &db)
                .map_err(dev("routed experts (listed device dispatch)"))?;
        }
        let mut at = ids.len();
        for (src, slots) in &rest {
            let cnt = slots.len();
            g.res
                .ops
                .get_rows(
                    &g.res.stream,
                    RowType::F32,
                    sc.x,
                    sc.rslots + (at * 4) as u64,
                    cnt as u32,
                    e as u32,
                    sc.xg,
                    1.0,
                )
                .map_err(dev("gathering expert inputs"))?;
            self.run_expert(stacks, src, |f| {
                self.swiglu(f, sc.xg, cnt, [sc.dg, sc.du, sc.da], sc.ys + ((base + at) * e * 4) as u64)
            })?;
            at += cnt;
        }
        Ok(())
    }

    /// Runs `launch` on the device copy of `src`: its place in the stacks, or for a miss
    /// streamed to the device a slot of the staging ring, copied there once the slot's previous
    /// readers are done and handed back after `launch`.
    fn run_expert(
        &self,
        stacks: &super::super::weights::DevExperts,
        src: &Source<'_>,
        launch: impl FnOnce(&DevFfn) -> Result<()>,
    ) -> Result<()> {
        let host = match src {
            Source::Device(_, f) => return launch(f),
            Source::Staged(host) => host,
        };
        let (g, api) = (self.g, self.g.api());
        let ring = g
            .res
            .staging
            .as_ref()
            .ok_or_else(|| EngineError::Gpu("qwen4exp: a streamed expert without a staging ring".into()))?;
        let slot = ring.take(&**api).map_err(dev("staging ring"))?;
        stacks.fill_staged(&**api, host, slot.base).map_err(|w| EngineError::Gpu(format!("staging an expert: {w}")))?;
        launch(&stacks.staged(slot.base))?;
        ring.launched(&**api, &g.res.stream, slot).map_err(dev("staging ring"))
    }

    /// The rest of a MoE layer once the routed experts' rows are in `sc.ys` (at the rows `map`
    /// names): the combine in rank order, the shared expert and its gate; `expert_bytes` gives the routed experts' weight
    /// bytes the device read (profiling).
    fn moe_tail(
        &mut self,
        layer: usize,
        map: DevicePtr,
        expert_bytes: impl FnOnce(&Self) -> Result<usize>,
    ) -> Result<()> {
        let (g, sc, n, e) = (self.g, &self.s.sc, self.n(), self.g.m.hp.n_embd);
        let m = &self.layer(layer).moe;
        let k = m.n_used;
        // The shared expert (its gate and up products ran with the router's,
        // [`GpuQwen4ExpChunk::moe_inputs`]), then the combine in rank order with its σ-gated rows added.
        g.res
            .ops
            .glu(&g.res.stream, sc.shg, sc.shu, sc.sha, (n * m.shared.gate.rows) as u32, GluAct::Silu)
            .map_err(dev("SwiGLU"))?;
        self.mm(&m.shared.down, sc.sha, n, sc.sh)?;
        g.res
            .ops
            .moe_combine_with(
                &g.res.stream,
                sc.ys,
                map,
                sc.rw,
                sc.y,
                Some((sc.sh, sc.shgate)),
                e as u32,
                n as u32,
                k as u32,
            )
            .map_err(dev("MoE combine"))?;
        // The router, the distinct experts the device ran and the shared expert, once each.
        let ffn = |f: &DevFfn| f.gate.mat_bytes + f.up.mat_bytes + f.down.mat_bytes;
        let w = m.router.mat_bytes + m.shared_gate.mat_bytes + ffn(&m.shared) + expert_bytes(self)?;
        self.count("moe", w + self.act(2 * e));
        Ok(())
    }

    /// The products of a MoE layer's input: the router logits, the shared expert's gate logit
    /// and its gate and up rows, the input quantized once for all of them. Returns whether
    /// `sc.xq` then holds the input's Q8_1 rows (some product read them), which the routed
    /// experts reuse.
    fn moe_inputs(&self, m: &super::super::weights::DevMoe) -> Result<bool> {
        let (sc, n) = (&self.s.sc, self.n());
        let outs =
            [(&m.router, sc.rlog), (&m.shared_gate, sc.shgate), (&m.shared.gate, sc.shg), (&m.shared.up, sc.shu)];
        self.project(sc.x, n, &outs)?;
        Ok(!self.g.res.opts.ordered && self.reads_q8_1(n, &outs, self.wdq()))
    }

    /// Whether this window's routed experts run by device dispatch ([`moe_on_device`]).
    fn moe_on_device(&self, m: &super::super::weights::DevMoe) -> bool {
        self.cache().is_none() && moe_on_device(&self.g.res.opts, m)
    }

    /// The routed experts by device dispatch: `mmvq_moe_*` read the router's choice in
    /// `sc.rids` (fused gate/up + SiLU when both have one type), outputs in `sc.ys`: a window's
    /// at each slot's row, in groups of tokens whose slots fit one launch; a prompt chunk's
    /// sorted by expert first (each expert's weights read about once a chunk). Nothing is read
    /// back (what a graph needs); per slot, the same products as the host path's. Returns the
    /// combine's map of slots to rows.
    fn experts_on_device(&self, m: &super::super::weights::DevMoe, x_quantized: bool) -> Result<DevicePtr> {
        let (sc, n, e) = (&self.s.sc, self.n(), self.g.m.hp.n_embd);
        let f = &m.experts.stack;
        let lin = self.lin();
        if !x_quantized {
            lin.quantize(sc.x, sc.xq, n, e).map_err(dev("quantizing the MoE input"))?;
        }
        let b = self.dispatch_buffers(sc.rids);
        let mats = [&f.gate, &f.up, &f.down];
        if n > WINDOW {
            lin.experts_sorted(mats, m.experts.n, m.n_used, n, &b, &sc.order)
                .map_err(dev("routed experts (sorted device dispatch)"))?;
            return Ok(sc.order.map);
        }
        lin.experts_by_dispatch(mats, m.experts.n, m.n_used, n, &b).map_err(dev("routed experts (device dispatch)"))?;
        Ok(sc.map)
    }

    /// How many distinct experts the window's choice names (read back: profiling only).
    fn distinct_experts(&self, k: usize, n_expert: usize) -> Result<usize> {
        let (g, n) = (self.g, self.n());
        let sel = read_choice(&**g.api(), &g.res.stream, self.s.sc.rids, n, k, n_expert)
            .map_err(dev("reading expert ids"))?;
        Ok(distinct(&sel))
    }

    /// The scratch buffers of a device-dispatch run of the routed experts reading `ids`.
    fn dispatch_buffers(&self, ids: DevicePtr) -> DispatchBuffers {
        let sc = &self.s.sc;
        DispatchBuffers { ids, xq: sc.xq, act: sc.da, act_q: sc.daq, gate: sc.dg, up: sc.du, y: sc.ys }
    }

    /// The routed experts the cache has no slot for, on the cache's CPU pool (the CPU backend's
    /// products, rows split across its workers) while the device runs the others: the window's
    /// block input is read back once, the rows of the tokens in each expert's `slots`
    /// (`token·k + rank`) go through it, and each output row lands at its slot of the device's
    /// expert outputs, where the combine weighs it like a device row.
    fn experts_on_cpu(&self, cache: &ExpertCache, experts: &[(&SwiGlu, &[usize])], k: usize) -> Result<()> {
        if experts.is_empty() {
            return Ok(());
        }
        let (g, sc, n, e) = (self.g, &self.s.sc, self.n(), self.g.m.hp.n_embd);
        let api = g.api();
        let mut b = vec![0u8; n * e * 4];
        api.memcpy_dtoh(&mut b, sc.x).map_err(dev("reading the MoE input"))?;
        let x: Vec<f32> = b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let outputs = cpu_expert_rows(cache, experts, &x, k, e);
        for ((_, slots), ys) in experts.iter().zip(&outputs) {
            for (row, &j) in ys.chunks_exact(e).zip(slots.iter()) {
                api.memcpy_htod(sc.ys + ((j * e) * 4) as u64, f32_bytes(row))
                    .map_err(dev("writing CPU expert rows"))?;
            }
        }
        Ok(())
    }
}
