//! The VRAM expert cache (`--expert-cache N`): `N` device slots per MoE layer for routed
//! experts, so a model whose experts do not all fit on the card still runs on it. An expert the
//! router picks is a **hit** when it holds a slot (computed on the device from the slot), is
//! **admitted** into a free slot on first use (copied from the mapped GGUF, then computed on
//! the device), and otherwise is a **miss**, computed on the CPU from the mapped file by the
//! CPU backend's kernels (the rows land in the device's expert-output buffer, and the
//! router weights are applied in the device's combine, so the result does not depend on which
//! side computed an expert: bit-identical to the all-resident run in the ordered-numerics mode).
//!
//! Two paths use it. Decode and verification windows (up to `MAX_COLS` tokens, fast mode) run
//! the **handoff** (`gpu-executor/src/experts/handoff.rs`): the device maps the router's choice through its
//! copy of the slot table, computes the hits by device dispatch and hands the misses to a host
//! thread through mapped memory, inside the captured graph. Longer prompt chunks and the
//! ordered-numerics mode read the choice back per layer (`gpu/moe.rs`, host readback).

pub use experts::counters::CacheStats;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// How `--expert-cache auto` sized the cache ([`AutoFit::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoFit {
    /// Slots per MoE layer (the expert count: every expert resident, no cache).
    pub slots: usize,
    pub n_expert: usize,
    /// Free VRAM after the other weights and one session, before the slots.
    pub free: u64,
    pub total: u64,
    /// `--vram-reserve-mib`, in bytes.
    pub reserve: u64,
    /// One slot in every MoE layer (an expert's gate, up and down in each).
    pub slot_bytes: u64,
}

impl AutoFit {
    /// The slots that fit in `free - reserve`, `slot_bytes` each, at most `n_expert`.
    pub fn new(free: u64, total: u64, reserve: u64, slot_bytes: u64, n_expert: usize) -> AutoFit {
        let room = free.saturating_sub(reserve);
        let slots = room.checked_div(slot_bytes).map_or(n_expert, |s| s.min(n_expert as u64) as usize);
        AutoFit { slots, n_expert, free, total, reserve, slot_bytes }
    }

    pub fn all_resident(&self) -> bool {
        self.slots >= self.n_expert
    }
}

/// `--expert-cache auto`'s measurement, shared by the executors: allocates one session of
/// `max_ctx` positions (`probe`), reads the free VRAM with it in place, frees it, and fits slots
/// of `slot_bytes` into what is left minus `reserve_mib`.
pub(crate) fn fit_auto<S, E: std::fmt::Display>(
    api: &dyn crate::device::GpuApi,
    reserve_mib: u64,
    slot_bytes: u64,
    n_expert: usize,
    max_ctx: usize,
    probe: impl FnOnce() -> Result<S, E>,
) -> model::error::Result<AutoFit> {
    use model::error::EngineError;
    let mem = {
        let _probe = probe().map_err(|e| EngineError::Gpu(format!("--expert-cache auto: a session of {max_ctx} positions does not fit beside the weights ({e}); a smaller --max-context leaves room")))?;
        api.mem_info().map_err(|e| EngineError::Gpu(format!("reading the free VRAM: {e}")))?
    };
    Ok(AutoFit::new(mem.free, mem.total, reserve_mib << 20, slot_bytes, n_expert))
}

impl std::fmt::Display for AutoFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use indicatif::HumanBytes as B;
        let what = if self.all_resident() {
            format!("all {} experts resident", self.n_expert)
        } else {
            format!("{} of {} experts per layer in VRAM, the rest on the CPU", self.slots, self.n_expert)
        };
        write!(
            f,
            "expert cache auto: {what} ({} free of {} after the other weights and a session, {} reserved, {} a slot across the MoE layers)",
            B(self.free),
            B(self.total),
            B(self.reserve),
            B(self.slot_bytes)
        )
    }
}

/// Where one expert runs for this layer's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the device, from this slot (already resident).
    Hit(usize),
    /// On the device from this free slot, after the caller copies the expert into it.
    Admit(usize),
    /// On the CPU.
    Cpu,
}

/// One expert copied in by adaptation ([`ExpertCache::end_window`]): the caller fills `slot`
/// of `layer` with `expert` before the next window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swap {
    pub layer: usize,
    pub expert: usize,
    pub slot: usize,
}

/// Adaptive residency (`--adapt-every N`): every `every` tokens, per layer, the rule of
/// [`experts::policy::pick_swaps`] over routing counts decayed by `decay` a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptation {
    pub every: usize,
    pub max_swaps: usize,
    pub decay: f64,
    pub ratio: f64,
}

impl Adaptation {
    /// The simulator's adaptive policy ([`experts::policy::Policy::ADAPTIVE`]) every
    /// `every` tokens; None for 0 (static residency).
    pub fn every(every: usize) -> Option<Adaptation> {
        match experts::policy::Policy::ADAPTIVE {
            experts::policy::Policy::Adaptive { max_swaps, decay, ratio, .. } if every > 0 => {
                Some(Adaptation { every, max_swaps, decay, ratio })
            }
            _ => None,
        }
    }
}

/// Decayed routing counts and the token clock of adaptive residency.
struct AdaptState {
    rule: Adaptation,
    score: Vec<Vec<f64>>,
    tokens: u64,
}

pub struct ExpertCache {
    slots: usize,
    adapt: Option<Mutex<AdaptState>>,
    /// The CPU workers of the experts without a slot (`--pool-workers`); None: the caller's pool.
    pool: Option<rayon::ThreadPool>,
    /// Microseconds spent computing experts on the CPU.
    cpu_us: AtomicU64,
    /// One expert's bytes on the device (what each admission, swap or preload copies).
    expert_bytes: u64,
    /// Per layer, per expert: its slot.
    slot_of: Mutex<Vec<Vec<Option<u32>>>>,
    /// Per layer, per expert: routing decisions so far (`--expert-profile-save`).
    counts: Mutex<Vec<Vec<u64>>>,
    preloaded: AtomicU64,
    lookups: AtomicU64,
    hits: AtomicU64,
    admitted: AtomicU64,
    cpu: AtomicU64,
    swapped: AtomicU64,
    /// `--pcie-frac`: the share of misses computed on the device instead of the CPU, and the
    /// credit that spreads them (a miss streams when the accumulated share reaches one).
    pcie_frac: f64,
    pcie_credit: Mutex<f64>,
    /// Decisions computed on the device instead of the CPU, and the experts copied to the
    /// staging ring for them.
    streamed: AtomicU64,
    streamed_experts: AtomicU64,
    /// Experts the device read from RAM over PCIe in handoff windows ([`ExpertCache::read_miss`]).
    pcie_reads: AtomicU64,
    /// Admissions made during a window whose copies wait for its end (the handoff path: the
    /// device's slot table is fixed while a window runs).
    deferred: Mutex<Vec<Swap>>,
    /// Experts [`ExpertCache::end_window`] gave a slot whose copy has not landed yet: they hold
    /// the slot but run on the CPU until [`ExpertCache::land`]. (Locked after `slot_of`.)
    pending: Mutex<std::collections::HashSet<(usize, usize)>>,
    /// Bumped at every change of the slot table (the device's copy is refreshed when it moves).
    version: AtomicU64,
    /// Fault injection: the next this many CPU-expert batches fail ([`ExpertCache::inject_faults`]).
    faults: AtomicU64,
}

impl ExpertCache {
    pub fn new(n_layer: usize, n_expert: usize, slots: usize) -> ExpertCache {
        ExpertCache {
            slots,
            adapt: None,
            pool: None,
            cpu_us: AtomicU64::new(0),
            expert_bytes: 0,
            slot_of: Mutex::new(vec![vec![None; n_expert]; n_layer]),
            counts: Mutex::new(vec![vec![0; n_expert]; n_layer]),
            preloaded: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            cpu: AtomicU64::new(0),
            swapped: AtomicU64::new(0),
            pcie_frac: 0.0,
            pcie_credit: Mutex::new(0.0),
            streamed: AtomicU64::new(0),
            streamed_experts: AtomicU64::new(0),
            pcie_reads: AtomicU64::new(0),
            deferred: Mutex::new(Vec::new()),
            pending: Mutex::new(Default::default()),
            version: AtomicU64::new(0),
            faults: AtomicU64::new(0),
        }
    }

    /// A cache of `slots` per layer set up as the GPU options say (`--adapt-every`,
    /// `--pool-workers`); `expert_bytes` is one expert's gate, up and down on the device (the
    /// copy counter's unit).
    pub fn for_options(
        n_layer: usize,
        n_expert: usize,
        slots: usize,
        opts: &crate::options::GpuOptions,
        expert_bytes: usize,
    ) -> model::error::Result<ExpertCache> {
        let mut c = ExpertCache::new(n_layer, n_expert, slots)
            .with_adaptation(Adaptation::every(opts.adapt_every))
            .with_pool(opts.pool_workers)?;
        c.expert_bytes = expert_bytes as u64;
        c.pcie_frac = opts.pcie_frac.clamp(0.0, 1.0);
        Ok(c)
    }

    /// The same cache sending share `frac` of its misses to the device (`--pcie-frac`).
    pub fn with_pcie_frac(mut self, frac: f64) -> ExpertCache {
        self.pcie_frac = frac.clamp(0.0, 1.0);
        self
    }

    /// Whether misses may be computed on the device instead (`--pcie-frac` > 0).
    pub fn streams(&self) -> bool {
        self.pcie_frac > 0.0
    }

    /// For a miss ([`Placement::Cpu`]) of `uses` decisions: whether it is copied to the staging
    /// ring and computed on the device instead. In a prompt chunk (`prompt`) every miss is;
    /// in a decode window, `--pcie-frac F` decides: every miss adds F to a credit and streams
    /// when the credit reaches one, so F = 0.5 streams every other miss and 1 all of them.
    /// Callers offer a layer's misses most-used first, so the streamed ones are those the
    /// device computes for the most tokens. The counters move the decisions from the CPU's
    /// count to the streamed one.
    pub fn stream_miss(&self, uses: usize, prompt: bool) -> bool {
        if !prompt && !self.take_pcie_credit() {
            return false;
        }
        self.cpu.fetch_sub(uses as u64, Ordering::Relaxed);
        self.streamed.fetch_add(uses as u64, Ordering::Relaxed);
        self.streamed_experts.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// For a miss of `uses` decisions in a handoff window (`crate::experts::pcie`): whether the
    /// device reads it from RAM over PCIe instead of the CPU computing it, by the same
    /// `--pcie-frac` credit as [`ExpertCache::stream_miss`] (callers offer misses most-used
    /// first). The decisions move from the CPU's count to the streamed one.
    pub fn read_miss(&self, uses: usize) -> bool {
        if !self.take_pcie_credit() {
            return false;
        }
        self.cpu.fetch_sub(uses as u64, Ordering::Relaxed);
        self.streamed.fetch_add(uses as u64, Ordering::Relaxed);
        self.pcie_reads.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn take_pcie_credit(&self) -> bool {
        if self.pcie_frac <= 0.0 {
            return false;
        }
        let mut credit = self.pcie_credit.lock().unwrap_or_else(|p| p.into_inner());
        *credit += self.pcie_frac;
        // A little slack so that shares like 0.1 reach one after ten misses despite rounding.
        if *credit < 1.0 - 1e-9 {
            return false;
        }
        *credit -= 1.0;
        true
    }

    /// The same cache with its own pool of `workers` CPU threads for the experts without a slot
    /// (0: every physical core but one). A pool that cannot start is an error naming the count.
    pub fn with_pool(mut self, workers: usize) -> model::error::Result<ExpertCache> {
        let n = if workers == 0 { num_cpus::get_physical().saturating_sub(1).max(1) } else { workers };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("strata-experts-{i}"))
            .build()
            .map_err(|e| model::error::EngineError::Unsupported(format!("--pool-workers {n}: {e}")))?;
        self.pool = Some(pool);
        Ok(self)
    }

    /// Workers of the CPU pool (the caller's pool's when none was made).
    pub fn pool_workers(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, rayon::ThreadPool::current_num_threads)
    }

    /// Runs `f` (experts on the CPU: their products split rows across the pool's threads) on
    /// the cache's pool, and counts its time.
    pub fn on_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let t = std::time::Instant::now();
        let r = match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        };
        self.cpu_us.fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
        r
    }

    /// The same cache with adaptive residency (`--adapt-every`; None: static).
    pub fn with_adaptation(mut self, rule: Option<Adaptation>) -> ExpertCache {
        let (n_layer, n_expert) = {
            let t = self.slot_of.lock().unwrap_or_else(|p| p.into_inner());
            (t.len(), t.first().map_or(0, Vec::len))
        };
        self.adapt =
            rule.map(|rule| Mutex::new(AdaptState { rule, score: vec![vec![0.0; n_expert]; n_layer], tokens: 0 }));
        self
    }

    /// Called after each window of `n_tokens`: decays the adaptive counts and, when the window
    /// crosses an adaptation point, moves the slot table (the most-routed missing experts into
    /// free slots or the slots of the least-routed residents). Returns the copies to make, the
    /// admissions deferred during the window first: each returned expert holds its slot but
    /// stays on the CPU (and out of [`ExpertCache::slot_table`]) until the caller reports its
    /// copy landed with [`ExpertCache::land`]; an evicted resident is a miss at once. Empty
    /// without adaptation or deferred admissions.
    pub fn end_window(&self, n_tokens: usize) -> Vec<Swap> {
        // Admissions deferred by `place_deferred` come first.
        let mut swaps = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(st) = &self.adapt {
            let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
            let rule = st.rule;
            let before = st.tokens / rule.every as u64;
            st.tokens += n_tokens as u64;
            let f = rule.decay.powi(n_tokens as i32);
            st.score.iter_mut().flatten().for_each(|x| *x *= f);
            if st.tokens / rule.every as u64 != before {
                let mut table = self.slot_of.lock().unwrap_or_else(|p| p.into_inner());
                let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let admitted = swaps.len();
                for (layer, row) in table.iter_mut().enumerate() {
                    // An expert whose copy is still on its way neither moves nor is evicted.
                    let resident: Vec<bool> = row.iter().map(Option::is_some).collect();
                    let used = resident.iter().filter(|&&r| r).count();
                    for (expert, victim) in experts::policy::pick_swaps(
                        &resident,
                        &st.score[layer],
                        self.slots.saturating_sub(used),
                        rule.max_swaps,
                        rule.ratio,
                    ) {
                        let in_flight = |v: usize| {
                            pending.contains(&(layer, v)) || swaps.iter().any(|s| s.layer == layer && s.expert == v)
                        };
                        if victim.is_some_and(in_flight) {
                            continue;
                        }
                        let slot = match victim {
                            Some(v) => row[v].take().map_or(0, |s| s as usize),
                            None => (0..self.slots).find(|s| !row.contains(&Some(*s as u32))).unwrap_or(0),
                        };
                        row[expert] = Some(slot as u32);
                        swaps.push(Swap { layer, expert, slot });
                    }
                }
                self.swapped.fetch_add((swaps.len() - admitted) as u64, Ordering::Relaxed);
                self.version.fetch_add(1, Ordering::Release);
            }
        }
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).extend(swaps.iter().map(|s| (s.layer, s.expert)));
        swaps
    }

    /// The copies of `swaps` (from [`ExpertCache::end_window`]) have landed: their experts
    /// serve from their slots from now on.
    pub fn land(&self, swaps: &[Swap]) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for s in swaps {
            pending.remove(&(s.layer, s.expert));
        }
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Experts holding a slot whose copy has not landed.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Where expert `e` of `layer` runs for `uses` routing decisions; a free slot is taken
    /// (the caller must fill it before computing from it).
    pub fn place(&self, layer: usize, e: usize, uses: usize) -> Placement {
        let uses = uses as u64;
        self.lookups.fetch_add(uses, Ordering::Relaxed);
        self.counts.lock().unwrap_or_else(|p| p.into_inner())[layer][e] += uses;
        if let Some(st) = &self.adapt {
            st.lock().unwrap_or_else(|p| p.into_inner()).score[layer][e] += uses as f64;
        }
        let mut table = self.slot_of.lock().unwrap_or_else(|p| p.into_inner());
        let row = &mut table[layer];
        if let Some(s) = row[e] {
            if self.pending.lock().unwrap_or_else(|p| p.into_inner()).contains(&(layer, e)) {
                // Its copy is still on its way: the CPU computes it meanwhile.
                self.cpu.fetch_add(uses, Ordering::Relaxed);
                return Placement::Cpu;
            }
            self.hits.fetch_add(uses, Ordering::Relaxed);
            return Placement::Hit(s as usize);
        }
        if let Some(free) = (0..self.slots).find(|s| !row.contains(&Some(*s as u32))) {
            row[e] = Some(free as u32);
            self.admitted.fetch_add(1, Ordering::Relaxed);
            self.version.fetch_add(1, Ordering::Release);
            return Placement::Admit(free);
        }
        self.cpu.fetch_add(uses, Ordering::Relaxed);
        Placement::Cpu
    }

    /// [`ExpertCache::place`] for the handoff path, where the device's slot table cannot change
    /// while a window runs: the slot of a hit, or None (the CPU computes it). An expert admitted
    /// now runs on the CPU this window; its copy is returned by the next
    /// [`ExpertCache::end_window`] and it serves from its slot once [`ExpertCache::land`] says
    /// the copy is there.
    pub fn place_deferred(&self, layer: usize, e: usize, uses: usize) -> Option<usize> {
        match self.place(layer, e, uses) {
            Placement::Hit(s) => Some(s),
            Placement::Admit(slot) => {
                self.cpu.fetch_add(uses as u64, Ordering::Relaxed);
                self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push(Swap { layer, expert: e, slot });
                None
            }
            Placement::Cpu => None,
        }
    }

    /// Fault injection (tests of issue 14's failure paths): the next `n` batches of CPU experts
    /// fail as a broken worker would.
    #[doc(hidden)]
    pub fn inject_faults(&self, n: u64) {
        self.faults.store(n, Ordering::Release);
    }

    /// An error when an injected fault is due ([`ExpertCache::inject_faults`]).
    pub fn take_fault(&self) -> Result<(), String> {
        match self.faults.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
            Ok(_) => Err("injected fault in a CPU expert worker".into()),
            Err(_) => Ok(()),
        }
    }

    /// The slot table, `[layer][expert]` as u32 (`abi::MOE_SLOT_MISS` for no slot), and its
    /// version (it changes with every admission, preload or swap).
    pub fn slot_table(&self) -> (Vec<u32>, u64) {
        let table = self.slot_of.lock().unwrap_or_else(|p| p.into_inner());
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let v = self.version.load(Ordering::Acquire);
        let slot = |l: usize, e: usize, s: Option<u32>| {
            s.filter(|_| !pending.contains(&(l, e))).unwrap_or(crate::abi::MOE_SLOT_MISS)
        };
        (
            table
                .iter()
                .enumerate()
                .flat_map(|(l, row)| row.iter().enumerate().map(move |(e, &s)| (l, e, s)))
                .map(|(l, e, s)| slot(l, e, s))
                .collect(),
            v,
        )
    }

    /// The slot table's version ([`ExpertCache::slot_table`]).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// A free slot of `layer` for expert `e` at start (profile order), or None when the layer's
    /// slots are full or `e` already holds one. The caller fills the slot.
    pub fn reserve(&self, layer: usize, e: usize) -> Option<usize> {
        let mut table = self.slot_of.lock().unwrap_or_else(|p| p.into_inner());
        let row = table.get_mut(layer)?;
        if row.get(e)?.is_some() {
            return None;
        }
        let free = (0..self.slots).find(|s| !row.contains(&Some(*s as u32)))?;
        row[e] = Some(free as u32);
        self.preloaded.fetch_add(1, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Release);
        Some(free)
    }

    /// Fills free slots at start from the STRP profile at `path` (most-routed first, per layer
    /// until its slots are full; a profile for another shape is refused): `copy(layer, expert,
    /// slot)` puts each chosen expert into its slot. Returns how many experts were copied.
    pub fn fill_from_profile(
        &self,
        path: &std::path::Path,
        n_expert: usize,
        mut copy: impl FnMut(usize, usize, usize) -> Result<(), String>,
    ) -> model::error::Result<usize> {
        use model::error::EngineError;
        let n_layer = self.slot_of.lock().unwrap_or_else(|p| p.into_inner()).len();
        let profile = experts::Profile::read(path).map_err(|e| EngineError::Unsupported(e.to_string()))?;
        profile.check_model(path, n_layer, n_expert).map_err(|e| EngineError::Unsupported(e.to_string()))?;
        let mut copied = 0;
        for &(l, e) in &profile.ranked {
            let (l, e) = (l as usize, e as usize);
            if let Some(slot) = self.reserve(l, e) {
                copy(l, e, slot).map_err(|err| {
                    EngineError::Gpu(format!("--expert-profile: copying expert {e} of layer {l}: {err}"))
                })?;
                copied += 1;
            }
        }
        Ok(copied)
    }

    /// Writes the routing counts so far as an STRP profile (`--expert-profile-save`).
    pub fn save_profile(&self, path: &std::path::Path) -> model::error::Result<()> {
        let p = experts::Profile::from_counts(&self.counts(), self.slots as u32)
            .map_err(|e| model::error::EngineError::Unsupported(e.to_string()))?;
        p.write(path).map_err(|e| model::error::EngineError::Unsupported(e.to_string()))
    }

    /// Routing decisions so far, `[layer][expert]`.
    pub fn counts(&self) -> Vec<Vec<u64>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            slots: self.slots,
            lookups: self.lookups.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            cpu: self.cpu.load(Ordering::Relaxed),
            preloaded: self.preloaded.load(Ordering::Relaxed),
            swapped: self.swapped.load(Ordering::Relaxed),
            streamed: self.streamed.load(Ordering::Relaxed),
            streamed_experts: self.streamed_experts.load(Ordering::Relaxed),
            pcie_read_experts: self.pcie_reads.load(Ordering::Relaxed),
            pcie_read_bytes: self.pcie_reads.load(Ordering::Relaxed) * self.expert_bytes,
            cpu_ms: self.cpu_us.load(Ordering::Relaxed) as f64 / 1000.0,
            copied_bytes: (self.preloaded.load(Ordering::Relaxed)
                + self.admitted.load(Ordering::Relaxed)
                + self.swapped.load(Ordering::Relaxed)
                + self.streamed_experts.load(Ordering::Relaxed))
                * self.expert_bytes,
            pool_workers: self.pool_workers(),
            ..CacheStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_until_full_then_misses_go_to_the_cpu() {
        let c = ExpertCache::new(2, 4, 2);
        assert_eq!(c.place(0, 3, 1), Placement::Admit(0));
        assert_eq!(c.place(0, 1, 2), Placement::Admit(1));
        assert_eq!(c.place(0, 3, 1), Placement::Hit(0));
        assert_eq!(c.place(0, 2, 1), Placement::Cpu);
        assert_eq!(c.place(1, 2, 1), Placement::Admit(0), "layers have their own slots");
        let s = c.stats();
        assert_eq!((s.lookups, s.hits, s.admitted, s.cpu), (6, 1, 3, 1));
        assert_eq!(c.counts()[0], vec![0, 2, 1, 2]);
    }

    #[test]
    fn reserve_fills_free_slots_in_order_and_never_twice() {
        let c = ExpertCache::new(1, 4, 2);
        assert_eq!(c.reserve(0, 2), Some(0));
        assert_eq!(c.reserve(0, 2), None, "already resident");
        assert_eq!(c.reserve(0, 0), Some(1));
        assert_eq!(c.reserve(0, 1), None, "full");
        assert_eq!(c.reserve(1, 0), None, "no such layer");
        assert_eq!(c.place(0, 2, 1), Placement::Hit(0));
        assert_eq!(c.stats().preloaded, 2);
    }

    #[test]
    fn adaptation_swaps_a_much_more_routed_expert_in_at_the_adaptation_point() {
        let rule = Adaptation { every: 2, max_swaps: 2, decay: 0.5, ratio: 2.0 };
        let c = ExpertCache::new(1, 4, 2).with_adaptation(Some(rule));
        assert_eq!(c.place(0, 0, 1), Placement::Admit(0));
        assert_eq!(c.place(0, 1, 3), Placement::Admit(1));
        assert_eq!(c.place(0, 3, 2), Placement::Cpu);
        assert_eq!(c.end_window(1), vec![], "not an adaptation point yet");
        // Scores after this window's decay: expert 0: 1·0.25, 1: 3·0.25, 3: 2·0.25 + 4·0.5 = 2.5.
        assert_eq!(c.place(0, 3, 4), Placement::Cpu);
        assert_eq!(c.place(0, 2, 1), Placement::Cpu);
        // Expert 3 (2.5) takes the slot of the weakest resident, 0 (0.25); expert 2 (0.5) is not
        // twice as routed as the next weakest, 1 (0.75), so it stays out.
        let swaps = c.end_window(1);
        assert_eq!(swaps, vec![Swap { layer: 0, expert: 3, slot: 0 }]);
        assert_eq!(c.place(0, 0, 1), Placement::Cpu, "the swapped-out expert lost its slot");
        // Until its copy lands the new expert runs on the CPU and is not in the device's table.
        assert_eq!(c.place(0, 3, 1), Placement::Cpu);
        let miss = crate::abi::MOE_SLOT_MISS;
        assert_eq!(c.slot_table().0, vec![miss, 1, miss, miss]);
        let v = c.version();
        c.land(&swaps);
        assert!(c.version() > v, "landing changes the table the device copies");
        assert_eq!(c.slot_table().0, vec![miss, 1, miss, 0]);
        assert_eq!(c.place(0, 3, 1), Placement::Hit(0));
        assert_eq!((c.stats().swapped, c.pending()), (1, 0));
        // Static residency never swaps.
        let s = ExpertCache::new(1, 4, 1).with_adaptation(Adaptation::every(0));
        s.place(0, 0, 1);
        s.place(0, 3, 50);
        assert!((0..8).all(|_| s.end_window(1).is_empty()));
    }

    #[test]
    fn deferred_admissions_serve_after_landing_and_pending_experts_are_never_evicted() {
        let rule = Adaptation { every: 1, max_swaps: 2, decay: 1.0, ratio: 2.0 };
        let c = ExpertCache::new(1, 4, 2).with_adaptation(Some(rule));
        // The handoff path: an admission during a window is computed on the CPU, copied after it.
        assert_eq!(c.place_deferred(0, 2, 1), None);
        let first = c.end_window(1);
        assert_eq!(first, vec![Swap { layer: 0, expert: 2, slot: 0 }]);
        assert_eq!((c.place_deferred(0, 2, 1), c.pending()), (None, 1), "still on its way");
        assert_eq!(c.place_deferred(0, 1, 1), None, "admitted to the free slot, copied after the window");
        // Expert 3, routed far more than the residents, would take the weakest one's slot:
        // both are in flight, so nothing is evicted.
        assert_eq!(c.place_deferred(0, 3, 40), None);
        let second = c.end_window(1);
        assert_eq!(second, vec![Swap { layer: 0, expert: 1, slot: 1 }]);
        c.land(&first);
        assert_eq!(c.place_deferred(0, 2, 1), Some(0));
        c.land(&second);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn cpu_experts_run_on_the_caches_own_pool_and_are_timed() {
        let c = ExpertCache::new(1, 4, 1).with_pool(2).unwrap();
        assert_eq!(c.pool_workers(), 2);
        let (name, threads) =
            c.on_pool(|| (std::thread::current().name().map(str::to_owned), rayon::current_num_threads()));
        assert!(name.is_some_and(|n| n.starts_with("strata-experts-")), "runs on the pool's threads");
        assert_eq!(threads, 2, "a product inside splits its rows over the pool's 2 workers");
        c.on_pool(|| std::thread::sleep(std::time::Duration::from_millis(5)));
        assert!(c.stats().cpu_ms >= 5.0, "{}", c.stats().cpu_ms);
        let all_but_one = ExpertCache::new(1, 4, 1).with_pool(0).unwrap().pool_workers();
        assert_eq!(all_but_one, num_cpus::get_physical().saturating_sub(1).max(1));
    }

    #[test]
    fn auto_fit_takes_the_slots_that_fit_beside_the_reserve() {
        const MIB: u64 = 1 << 20;
        // 10 MiB free, 1 MiB reserved, 2 MiB a slot: 4 slots (8 MiB), not 5 (10 MiB).
        let f = AutoFit::new(10 * MIB, 24 * MIB, MIB, 2 * MIB, 8);
        assert_eq!((f.slots, f.all_resident()), (4, false));
        // Room for more than the experts: every expert resident.
        let f = AutoFit::new(100 * MIB, 128 * MIB, MIB, 2 * MIB, 8);
        assert_eq!((f.slots, f.all_resident()), (8, true));
        // The reserve larger than what is free: no slot (every expert on the CPU), no underflow.
        assert_eq!(AutoFit::new(MIB / 2, 24 * MIB, MIB, 2 * MIB, 8).slots, 0);
        assert!(AutoFit::new(10 * MIB, 24 * MIB, MIB, 2 * MIB, 8).to_string().contains("4 of 8 experts per layer"));
    }

    #[test]
    fn pcie_frac_streams_that_share_of_the_misses_and_moves_their_counts() {
        for (frac, want) in [(0.0, 0), (0.1, 1), (0.25, 2), (0.5, 5), (1.0, 10)] {
            let c = ExpertCache::new(1, 16, 0).with_pcie_frac(frac);
            let streamed = (0..10).filter(|&e| c.place(0, e, 2) == Placement::Cpu && c.stream_miss(2, false)).count();
            assert_eq!(streamed, want, "--pcie-frac {frac}");
            let s = c.stats();
            assert_eq!(
                (s.streamed_experts, s.streamed, s.cpu),
                (want as u64, 2 * want as u64, 20 - 2 * want as u64),
                "{frac}"
            );
        }
        // Prompt chunks stream every miss, whatever the share.
        let c = ExpertCache::new(1, 16, 0);
        assert!((0..4).all(|e| c.place(0, e, 3) == Placement::Cpu && c.stream_miss(3, true)));
        assert_eq!((c.stats().streamed, c.stats().cpu), (12, 0));
    }
}
