//! The shared decoder's routed-expert FFN on the device (`GpuModel`), by its two paths
//! ([`MoePath`]): device dispatch and host readback (each selected expert runs on the tokens
//! that chose it, like the CPU backend), and through the expert cache's handoff. Both paths
//! give the same bits. The steps both families share are the parent module's.

use std::borrow::Cow;

use super::{Chosen, HandoffBuffers, Runs, distinct, experts_by_handoff, one_token, place_chosen, read_choice};
use crate::abi::MAX_COLS;
use crate::device::{DevicePtr, GpuError};
use crate::experts::cache::{AutoFit, ExpertCache};
use crate::linear::DispatchBuffers;
use crate::model::{GpuModel, Scratch};
use crate::ops::GluAct;
use crate::options::MoePath;
use crate::resident::ExpertStacks;
use crate::upload::{DevMat, MatKind, Tmp, Uploader, f32_bytes, q8_1_bytes, u32_bytes};
use cpu_executor::{DecoderMatmul, MatCpu, Numerics};
use model::Ffn;

impl GpuModel {
    /// Whether a window of `n` tokens runs its routed experts by device dispatch
    /// ([`MoePath`]'s rule). The single switch between the two paths: a mode that needs the
    /// host-readback path (e.g. ordered numerics) makes this false.
    pub(crate) fn moe_on_device(&self, n: usize) -> bool {
        // Ordered mode keeps the host path: it runs every expert through `matmul` (ordered).
        !self.res.opts.ordered
            && self.moe_quantized
            && self.res.expert_cache.is_none()
            && !experts::trace::dumping()
            && match self.res.opts.moe {
                MoePath::Host => false,
                MoePath::Device => true,
                MoePath::Auto => n <= MAX_COLS,
            }
    }

    /// Whether a window of `n` tokens runs its routed experts through the expert cache's
    /// handoff (`super::experts::handoff`): hits by device dispatch over the slots, misses on the
    /// CPU, no readback, so the window can be a graph. Fast mode only (the ordered mode's
    /// experts are the host path's `mmv_ordered` products); not while profiling (its per-layer
    /// expert counts read the choice back) or dumping the routing. With `--pcie-frac` the
    /// device reads its share of the misses from RAM (`super::experts::pcie`).
    pub(crate) fn moe_by_handoff(&self, n: usize, profiling: bool) -> bool {
        self.res.handoff.is_some()
            && self.res.expert_cache.is_some()
            && !self.res.opts.ordered
            && self.moe_quantized
            && !profiling
            && !experts::trace::dumping()
            && n <= MAX_COLS
            && self.res.opts.moe != MoePath::Host
    }

    /// Routed experts of `layer` for `n` tokens through the handoff (see
    /// [`GpuModel::moe_by_handoff`]); output in `sc.o`.
    pub(crate) fn moe_handoff(
        &self,
        sc: &Scratch,
        layer: usize,
        n: usize,
        [router, gate, up, down]: [&DevMat; 4],
    ) -> std::result::Result<(), GpuError> {
        let (Some(h), Some(cache)) = (&self.res.handoff, &self.res.expert_cache) else {
            return Err(GpuError::Launch { kernel: "moe".into(), what: "no expert cache handoff".into() });
        };
        let hp = &self.model.hp;
        let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
        let (ops, st) = (&self.res.ops, &self.res.stream);
        let (d, ne, k) = (hp.n_embd, spec.n_expert, spec.n_expert_used);
        self.matmul(router, 0, sc.xn, sc.xq, n, sc.router, Tmp { wdq: 0, xh: sc.xh })?;
        ops.moe_router(st, sc.router, sc.sel_ids, sc.sel_w, n as u32, ne as u32, k as u32, spec.norm_weights)?;
        // The host's rows go after the chunk's own rows of y_e.
        let b = HandoffBuffers {
            ids: sc.sel_ids,
            x: sc.xn,
            slots: sc.sel_slots,
            map: sc.map,
            miss_base: sc.chunk * k,
            dispatch: self.dispatch_buffers(sc, sc.sel_ids),
        };
        experts_by_handoff(&self.lin(), h, cache, layer, n, [k, ne, d], [gate, up, down], &b)?;
        ops.moe_combine(st, sc.y_e, sc.map, sc.sel_w, sc.o, d as u32, n as u32, k as u32)
    }

    /// Host side of the handoff for one layer: the rows of the experts without a slot on the
    /// cache's CPU pool, each at its slot (`[n·k][n_embd]`; the rows of hits stay zero).
    pub(crate) fn handoff_misses(
        &self,
        p: &crate::experts::handoff::Published,
        n: usize,
    ) -> std::result::Result<crate::experts::handoff::Answer, GpuError> {
        let Some(cache) = &self.res.expert_cache else {
            return Err(GpuError::Launch { kernel: "moe".into(), what: "no expert cache".into() });
        };
        let d = self.model.hp.n_embd;
        let k = p.ids.len() / n.max(1);
        // Quantized at the first expert the CPU computes (a layer of hits needs none).
        let shared = std::sync::OnceLock::new();
        p.miss_rows(cache, d, |e, slots| {
            let shared = shared.get_or_init(|| self.shared_acts(p.layer, &p.x));
            self.expert_on_cpu(
                p.layer,
                e,
                slots.iter().map(|&j| &p.x[j / k * d..(j / k + 1) * d]),
                one_token(shared, slots, k),
            )
        })
    }

    /// Routed experts by device dispatch for `n` tokens whose normed input is in `sc.xn` /
    /// `sc.xq`; output in `sc.o`. The router's choice stays on the device: `mmvq_moe_*` reads
    /// it (fused gate/up + SiLU when both have one type, then down), `moe_combine` adds the
    /// slots through the identity map in rank order, exactly as [`GpuModel::moe`] does. With
    /// `count` (profiling) the choice is read back afterwards to count the distinct experts
    /// (the return value); otherwise 0.
    pub(crate) fn moe_device(
        &self,
        sc: &Scratch,
        n: usize,
        [router, gate, up, down]: [&DevMat; 4],
        count: bool,
    ) -> std::result::Result<usize, GpuError> {
        let hp = &self.model.hp;
        let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
        let (api, ops, st) = (self.res.ops.api(), &self.res.ops, &self.res.stream);
        let (d, ne, k) = (hp.n_embd, spec.n_expert, spec.n_expert_used);
        self.matmul(router, 0, sc.xn, sc.xq, n, sc.router, Tmp { wdq: 0, xh: sc.xh })?;
        ops.moe_router(st, sc.router, sc.sel_ids, sc.sel_w, n as u32, ne as u32, k as u32, spec.norm_weights)?;
        let b = self.dispatch_buffers(sc, sc.sel_ids);
        // A prompt chunk sorts its slots by expert first: each expert's weights read once.
        let map = if n > MAX_COLS {
            self.lin().experts_sorted([gate, up, down], ne, k, n, &b, &sc.order)?;
            sc.order.map
        } else {
            self.lin().experts_by_dispatch([gate, up, down], ne, k, n, &b)?;
            sc.map_id
        };
        ops.moe_combine(st, sc.y_e, map, sc.sel_w, sc.o, d as u32, n as u32, k as u32)?;
        if !count {
            return Ok(0);
        }
        Ok(distinct(&read_choice(&**api, st, sc.sel_ids, n, k, ne)?))
    }

    /// Routed experts of `layer` for `n` tokens whose normed input is in `sc.xn` (and `sc.xq`);
    /// output in `sc.o`. Returns how many distinct experts ran on the device. Host readback path
    /// ([`MoePath`]); with an expert cache, each chosen expert runs from its slot, from a slot
    /// it is admitted into, or on the CPU ([`ExpertCache::place`]).
    pub(crate) fn moe(
        &self,
        sc: &Scratch,
        layer: usize,
        n: usize,
        [router, gate, up, down]: [&DevMat; 4],
    ) -> std::result::Result<usize, GpuError> {
        let hp = &self.model.hp;
        let spec = hp.moe.as_ref().expect("moe layer without moe hparams");
        let (api, ops, st) = (self.res.ops.api(), &self.res.ops, &self.res.stream);
        let (d, ne, k, ff) = (hp.n_embd, spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
        self.matmul(router, 0, sc.xn, sc.xq, n, sc.router, Tmp { wdq: 0, xh: sc.xh })?;
        ops.moe_router(st, sc.router, sc.sel_ids, sc.sel_w, n as u32, ne as u32, k as u32, spec.norm_weights)?;
        // The choice comes back to the host: which experts run, on which tokens.
        let sel = read_choice(&**api, st, sc.sel_ids, n, k, ne)?;
        if experts::trace::dumping() {
            let mut wb = vec![0u8; n * k * 4];
            api.memcpy_dtoh(&mut wb, sc.sel_w)?;
            let ws: Vec<f32> = wb.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect();
            for t in 0..n {
                experts::trace::dump(layer, &sel[t * k..(t + 1) * k], &ws[t * k..(t + 1) * k]);
            }
        }
        let quantized = matches!(gate.kind, MatKind::Q(_)); // false in ordered mode (Raw)
        if gate.kind != up.kind {
            return Err(GpuError::Launch {
                kernel: "moe".into(),
                what: "expert gate and up weights of different kinds".into(),
            });
        }
        let (xcol, xbytes) = if quantized { (sc.xq, q8_1_bytes(d)) } else { (sc.xn, d * 4) };
        let chosen = place_chosen(
            &sel,
            ne,
            layer,
            self.res.expert_cache.as_ref(),
            self.res.staging.is_some(),
            n > MAX_COLS,
            |e, slot| self.upload_expert(layer, e, slot, [gate, up, down]),
        )?;
        let mut map = vec![0u32; n * k];
        let mut row = 0usize; // next free row of y_e
        // The experts without a slot (expert, its decisions, first output row), run on the
        // cache's CPU pool once the device's are launched.
        let mut on_cpu: Vec<(usize, Vec<usize>, usize)> = Vec::new();
        for Chosen { expert: e, slots, runs } in &chosen {
            // The expert's matrices on the device and its index in them (and its ring slot).
            let (mats, e_dev, staged) = match *runs {
                Runs::Device(s) => ([*gate, *up, *down], s, None),
                Runs::Staged => {
                    let (mats, slot) = self.stage_expert(layer, *e, [gate, up, down])?;
                    (mats, 0, Some(slot))
                }
                Runs::Cpu => {
                    for (c, &j) in slots.iter().enumerate() {
                        map[j] = (row + c) as u32;
                    }
                    on_cpu.push((*e, slots.clone(), row));
                    row += slots.len();
                    continue;
                }
            };
            let [gate, up, down] = &mats;
            // Gather the inputs of the tokens that chose `e`, then run in windows of MAX_COLS;
            // a prompt chunk's expert runs on all its tokens at once, by the prompt rule of the
            // products (dequantize + GEMM, or MMQ, from GEMM_MIN_TOKENS tokens; MMVQ below).
            let prompt_rule = quantized && n > MAX_COLS;
            let per = if prompt_rule { slots.len() } else { MAX_COLS };
            for group in slots.chunks(per) {
                let r = group.len();
                let (src, bytes) = if prompt_rule { (sc.xn, d * 4) } else { (xcol, xbytes) };
                for (c, &j) in group.iter().enumerate() {
                    let t = j / k;
                    api.memcpy_dtod_async(st, sc.xq_e + (c * bytes) as u64, src + (t * bytes) as u64, bytes)?;
                }
                let tmp = Tmp { wdq: if prompt_rule { sc.wdq } else { 0 }, xh: sc.xh };
                let (xin, xinq) = match (prompt_rule, quantized) {
                    // f32 rows gathered; quantized into the layer's `xq` (read only to gather
                    // on the other path) for the products that read Q8_1.
                    (true, _) => {
                        let lin = self.lin();
                        if lin.reads_q8_1(gate, r, tmp) || lin.reads_q8_1(up, r, tmp) {
                            self.quantize(sc.xq_e, sc.xq, r, d)?;
                        }
                        (sc.xq_e, sc.xq)
                    }
                    (false, true) => (0, sc.xq_e),
                    (false, false) => (sc.xq_e, 0),
                };
                self.matmul(gate, e_dev, xin, xinq, r, sc.gate, tmp)?;
                self.matmul(up, e_dev, xin, xinq, r, sc.up, tmp)?;
                ops.glu(st, sc.gate, sc.up, sc.act, (r * ff) as u32, GluAct::Silu)?;
                let dq = sc.xq_e; // reuse: the gathered inputs are consumed
                let quant_down =
                    matches!(down.kind, MatKind::Q(_)) && (!prompt_rule || self.lin().reads_q8_1(down, r, tmp));
                if quant_down {
                    self.quantize(sc.act, dq, r, ff)?;
                }
                let yrow = sc.y_e + (row * d * 4) as u64;
                self.matmul(down, e_dev, sc.act, dq, r, yrow, tmp)?;
                for (c, &j) in group.iter().enumerate() {
                    map[j] = (row + c) as u32;
                }
                row += r;
            }
            if let (Some(slot), Some(ring)) = (staged, &self.res.staging) {
                ring.launched(&**api, st, slot)?;
            }
        }
        let ran = chosen.len();
        if let (Some(cache), false) = (&self.res.expert_cache, on_cpu.is_empty()) {
            let mut b = vec![0u8; n * d * 4];
            api.memcpy_dtoh(&mut b, sc.xn)?;
            let xs: Vec<f32> = b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect();
            let shared = self.shared_acts(layer, &xs);
            let outputs = cache.on_pool(|| {
                on_cpu
                    .iter()
                    .map(|(e, slots, _)| {
                        self.expert_on_cpu(
                            layer,
                            *e,
                            slots.iter().map(|&j| &xs[j / k * d..(j / k + 1) * d]),
                            one_token(&shared, slots, k),
                        )
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
            })?;
            for ((_, _, first_row), y) in on_cpu.iter().zip(&outputs) {
                api.memcpy_htod(sc.y_e + (first_row * d * 4) as u64, f32_bytes(y))?;
            }
        }
        api.memcpy_htod(sc.map, u32_bytes(&map))?;
        ops.moe_combine(st, sc.y_e, sc.map, sc.sel_w, sc.o, d as u32, n as u32, k as u32)?;
        Ok(ran - on_cpu.len())
    }

    /// The scratch buffers of a device-dispatch run of the routed experts reading `ids`.
    fn dispatch_buffers(&self, sc: &Scratch, ids: DevicePtr) -> DispatchBuffers {
        DispatchBuffers { ids, xq: sc.xq, act: sc.act, act_q: sc.xq_e, gate: sc.gate, up: sc.up, y: sc.y_e }
    }

    /// A miss computed on the device from a copy: copies expert `e` of `layer` (gate, up,
    /// down, as stored) into the next slot of the staging ring and returns views of its
    /// matrices there (index 0) and the slot, to hand back once its products are launched.
    fn stage_expert(
        &self,
        layer: usize,
        e: usize,
        dev: [&DevMat; 3],
    ) -> std::result::Result<([DevMat; 3], crate::experts::staging_ring::RingSlot), GpuError> {
        let Some(ring) = &self.res.staging else {
            return Err(GpuError::Launch { kernel: "moe".into(), what: format!("layer {layer}: no staging ring") });
        };
        let slot = ring.take(&**self.res.ops.api())?;
        // The slot as a stack of one: the matrices back to back from its base.
        let mut at = slot.base;
        let views = dev.map(|d| {
            let v = DevMat { ptr: at, ..*d };
            at += d.mat_bytes as u64;
            v
        });
        self.upload_expert(layer, e, 0, [&views[0], &views[1], &views[2]])?;
        Ok((views, slot))
    }

    /// Copies expert `e` of `layer` (gate, up, down, as stored in the mapped file) into slot
    /// `slot` of the device stacks.
    fn upload_expert(
        &self,
        layer: usize,
        e: usize,
        slot: usize,
        dev: [&DevMat; 3],
    ) -> std::result::Result<(), GpuError> {
        let host = self.host_expert(layer, e).ok_or_else(|| GpuError::Launch {
            kernel: "moe".into(),
            what: format!("layer {layer} has no routed experts"),
        })?;
        for (bytes, d) in host.into_iter().zip(dev) {
            self.res.ops.api().memcpy_htod(d.expert(slot), bytes)?;
        }
        Ok(())
    }

    /// Expert `e` of `layer`'s gate, up and down bytes as stored (None: a dense layer).
    fn host_expert(&self, layer: usize, e: usize) -> Option<[&[u8]; 3]> {
        let Ffn::Moe { gate, up, down, .. } = &self.model.w.layers[layer].ffn.ffn else { return None };
        Some([gate, up, down].map(|w| {
            let per = w.data().len() / w.n_mat;
            &w.data()[e * per..(e + 1) * per]
        }))
    }

    /// Expert `e` of `layer` on the CPU for the rows `xs` (normed inputs): `down(silu(gate x) ⊙
    /// up x)` with the CPU backend's products — its ordered-numerics ones in the ordered mode,
    /// the same code the device's `mmv_ordered` runs — returned as `[rows][n_embd]`.
    fn expert_on_cpu<'x>(
        &self,
        layer: usize,
        e: usize,
        xs: impl Iterator<Item = &'x [f32]>,
        shared: Option<&cpu_executor::ExpertActs>,
    ) -> std::result::Result<Vec<f32>, GpuError> {
        let Ffn::Moe { gate, up, down, .. } = &self.model.w.layers[layer].ffn.ffn else {
            return Err(GpuError::Launch {
                kernel: "moe".into(),
                what: format!("layer {layer} has no routed experts"),
            });
        };
        let x: Vec<f32> = xs.flatten().copied().collect();
        let (r, ff, ordered) = (x.len() / gate.cols, gate.rows, self.res.opts.ordered);
        let (mut g, mut u, mut y) = (vec![0f32; r * ff], vec![0f32; r * ff], vec![0f32; r * down.rows]);
        match shared.filter(|a| a.gate_up()[0].n() == r) {
            // The expert's one token, quantized once for all the layer's experts (the same bits).
            Some(acts) => {
                let [ag, au] = acts.gate_up();
                cpu_executor::matmul_prepared(&gate.matrix(e), ag, &mut g);
                cpu_executor::matmul_prepared(&up.matrix(e), au, &mut u);
            }
            None => {
                self.model.mm(Numerics::of(ordered, false), gate, e, &x, r, &mut g);
                self.model.mm(Numerics::of(ordered, false), up, e, &x, r, &mut u);
            }
        }
        let act: Vec<f32> = if ordered {
            g.iter().zip(&u).map(|(&a, &b)| quant::fmath::silu(a) * b).collect()
        } else {
            let mut a = vec![0f32; r * ff];
            cpu_kernels::swiglu(&g, &u, &mut a);
            a
        };
        self.model.mm(Numerics::of(ordered, false), down, e, &act, r, &mut y);
        Ok(y)
    }

    /// Each token of `layer`'s MoE input `x` (`[n][n_embd]`) quantized once for the gate and up
    /// products of every expert the CPU computes for it alone (as `mm` prepares one token);
    /// empty where `mm` prepares per product (the ordered mode).
    fn shared_acts(&self, layer: usize, x: &[f32]) -> Vec<cpu_executor::ExpertActs> {
        let Ffn::Moe { gate, up, .. } = &self.model.w.layers[layer].ffn.ffn else { return Vec::new() };
        let p = Numerics::of(self.res.opts.ordered, false);
        let Some(entry) = self.model.acts_entry(p, gate, 1).filter(|_| self.model.acts_entry(p, up, 1).is_some())
        else {
            return Vec::new();
        };
        x.chunks_exact(gate.cols).map_while(|row| cpu_executor::ExpertActs::new(entry, gate, up, row, 1)).collect()
    }

    /// Fills the expert cache's slots from an STRP profile (most-routed first, per layer until
    /// its slots are full). Returns how many experts were copied.
    pub fn fill_expert_cache(&self, path: &std::path::Path) -> model::error::Result<usize> {
        self.res.fill_expert_cache(path, self)
    }

    /// `--expert-cache auto`: gives the MoE layers as many expert slots as fit in the free VRAM
    /// with one session (`kv`, `max_ctx`, `prefill_chunk`) allocated, minus
    /// `--vram-reserve-mib`; every expert resident (no cache) when all fit. Called once, after
    /// [`GpuModel::new`] with `auto` (which leaves 0 slots: every expert on the CPU until
    /// then). None for a model without routed experts.
    pub fn fit_expert_cache(
        &mut self,
        kv: cpu_executor::kv_cache::KvType,
        max_ctx: usize,
        prefill_chunk: usize,
    ) -> model::error::Result<Option<AutoFit>> {
        let Some(n_expert) = self.model.hp.moe.as_ref().map(|m| m.n_expert) else { return Ok(None) };
        let api = self.res.ops.api().clone();
        let slot_bytes: u64 = self
            .w
            .layers
            .iter()
            .map(|l| match &l.ffn.ffn {
                Ffn::Moe { gate, up, down, .. } => (gate.mat_bytes + up.mat_bytes + down.mat_bytes) as u64,
                Ffn::Dense { .. } => 0,
            })
            .sum();
        let fit = crate::experts::cache::fit_auto(
            &*api,
            self.res.opts.vram_reserve_mib,
            slot_bytes,
            n_expert,
            max_ctx,
            || self.new_session(kv, max_ctx, prefill_chunk),
        )?;
        let mut upl = Uploader::new(&*api, self.res.opts.ordered);
        for (il, (host, dev)) in self.model.w.layers.iter().zip(&mut self.w.layers).enumerate() {
            let (Ffn::Moe { gate: hg, up: hu, down: hd, .. }, Ffn::Moe { gate, up, down, .. }) =
                (&host.ffn.ffn, &mut dev.ffn.ffn)
            else {
                continue;
            };
            for (h, d, what) in
                [(hg, gate, "ffn_gate_exps.weight"), (hu, up, "ffn_up_exps.weight"), (hd, down, "ffn_down_exps.weight")]
            {
                let name = model::decoder::WeightName::Layer(il, what).to_string();
                *d = if fit.all_resident() { upl.mat(h, &name)? } else { upl.slots(h, &name, fit.slots)? };
            }
        }
        let (allocs, bytes) = upl.finish();
        let per_expert = fit.slot_bytes as usize
            / self.w.layers.iter().filter(|l| matches!(l.ffn.ffn, Ffn::Moe { .. })).count().max(1);
        let cache = (!fit.all_resident())
            .then(|| ExpertCache::for_options(self.model.hp.n_layer, n_expert, fit.slots, &self.res.opts, per_expert))
            .transpose()?;
        self.res.replace_expert_cache(allocs, bytes, cache)?;
        self.res.handoff =
            crate::model::handoff_for(&*api, &self.model, &self.w, self.res.expert_cache.as_ref(), &self.res.opts)?;
        Ok(Some(fit))
    }

    /// Writes the routing counts of this run as an STRP profile (`--expert-profile-save`).
    pub fn save_expert_profile(&self, path: &std::path::Path) -> model::error::Result<()> {
        self.res.save_expert_profile(path)
    }
}

/// The shared decoder's expert stacks: the MoE layers' `*_exps` tensors, one expert a slice.
impl ExpertStacks for GpuModel {
    fn n_expert(&self) -> usize {
        self.model.hp.moe.as_ref().map_or(0, |m| m.n_expert)
    }

    fn expert_parts(
        &self,
        layer: usize,
        expert: usize,
        slot: usize,
    ) -> model::error::Result<Vec<(DevicePtr, Cow<'_, [u8]>)>> {
        let (Some(host), Ffn::Moe { gate, up, down, .. }) =
            (self.host_expert(layer, expert), &self.w.layers[layer].ffn.ffn)
        else {
            return Ok(Vec::new());
        };
        Ok(host.into_iter().zip([gate, up, down]).map(|(h, d)| (d.expert(slot), Cow::Borrowed(h))).collect())
    }
}
