//! What every model on the device holds besides its own weights ([`Resident`]): the launch
//! layer, its options and stream, the device allocations, and the expert cache with its
//! companions (the per-layer handoff, the swap copies, the staging ring). It owns what both
//! families do alike with them (the cache's counters, its profile, filling it, adapting it
//! after a window, installing a new one) and frees everything once, on drop. A model says
//! where its expert stacks are through [`ExpertStacks`].

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use crate::device::{DevicePtr, GpuApi, Stream};
use crate::experts::cache::{CacheStats, ExpertCache};
use crate::experts::handoff::ExpertHandoff;
use crate::experts::staging_ring::StagingRing;
use crate::experts::swap::SwapCopies;
use crate::ops::GpuOps;
use crate::options::GpuOptions;
use crate::upload::gpu_err;
use model::error::{EngineError, Result};

/// Where a model's routed experts are: on the host, and their slots on the device.
pub(crate) trait ExpertStacks {
    /// Experts per MoE layer (the largest; 0 without routed experts).
    fn n_expert(&self) -> usize;
    /// What copying expert `expert` of `layer` into cache slot `slot` copies: (device
    /// destination, host bytes laid out as at upload) of its gate, up and down. Empty for a
    /// layer without routed experts.
    fn expert_parts(&self, layer: usize, expert: usize, slot: usize) -> Result<Vec<(DevicePtr, Cow<'_, [u8]>)>>;
}

/// The device-resident core of a model (see the module docs).
pub struct Resident {
    pub(crate) ops: GpuOps,
    pub(crate) opts: GpuOptions,
    pub(crate) stream: Stream,
    pub(crate) allocs: Vec<DevicePtr>,
    /// Bytes of weights uploaded (with an expert cache: its empty slots included).
    pub weight_bytes: usize,
    /// `--expert-cache N` with fewer slots than experts: which expert holds which slot, and the
    /// counters. None: every expert resident.
    pub(crate) expert_cache: Option<ExpertCache>,
    /// The expert cache's per-layer handoff to the CPU inside graphs (with the cache).
    pub(crate) handoff: Option<ExpertHandoff>,
    /// Adaptive residency's copies on a side stream (made at the first swap).
    pub(crate) swap_copies: Mutex<Option<SwapCopies>>,
    /// With an expert cache, the staging ring of the misses computed on the device from a copy
    /// (prompt chunks, `--pcie-frac` on the host-readback path).
    pub(crate) staging: Option<StagingRing>,
}

impl Drop for Resident {
    fn drop(&mut self) {
        let api = self.ops.api().clone();
        for p in self.allocs.drain(..) {
            let _ = api.free(p);
        }
        if let Some(h) = self.handoff.take() {
            let _ = h.free(&*api);
        }
        if let Some(c) = self.swap_copies.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.free(&*api);
        }
        if let Some(r) = &self.staging {
            let _ = r.free(&*api);
        }
    }
}

impl Resident {
    /// A core over `ops` whose uploads made `allocs` (`weight_bytes` of weights).
    pub(crate) fn new(
        ops: GpuOps,
        opts: GpuOptions,
        stream: Stream,
        allocs: Vec<DevicePtr>,
        weight_bytes: usize,
    ) -> Resident {
        Resident {
            ops,
            opts,
            stream,
            allocs,
            weight_bytes,
            expert_cache: None,
            handoff: None,
            swap_copies: Mutex::new(None),
            staging: None,
        }
    }

    pub fn api(&self) -> &Arc<dyn GpuApi> {
        self.ops.api()
    }

    /// The options the model runs with.
    pub fn opts(&self) -> &GpuOptions {
        &self.opts
    }

    /// The expert cache (`--expert-cache N` with fewer slots than experts).
    pub fn expert_cache(&self) -> Option<&ExpertCache> {
        self.expert_cache.as_ref()
    }

    /// The expert cache's counters, the handoff's included.
    pub fn expert_cache_stats(&self) -> Option<CacheStats> {
        let stats = self.expert_cache.as_ref().map(ExpertCache::stats)?;
        Some(self.handoff.as_ref().map_or(stats, |h| h.add_stats(stats)))
    }

    /// Which backend runs the model, for messages: `hip (Radeon RX 7900 XTX, gfx1100)`, `emu (...)`.
    pub fn backend(&self) -> String {
        let i = self.api().info();
        format!("{:?} ({}, {})", i.backend, i.name, i.arch).to_lowercase()
    }

    /// Whether the device's memory is the host's (the software device), so a session's KV cache
    /// counts against the host's memory.
    pub fn memory_is_the_hosts(&self) -> bool {
        self.api().info().backend == crate::Device::Emu
    }

    /// [`Resident::save_expert_profile`] for the loaded-model interface: Ok(false) without an
    /// expert cache.
    pub fn save_expert_profile_if_cached(&self, path: &std::path::Path) -> Result<bool> {
        if self.expert_cache.is_none() {
            return Ok(false);
        }
        self.save_expert_profile(path).map(|()| true)
    }

    /// Writes this run's routing counts as an STRP profile (`--expert-profile-save`).
    pub fn save_expert_profile(&self, path: &std::path::Path) -> Result<()> {
        match &self.expert_cache {
            Some(c) => c.save_profile(path),
            None => Err(EngineError::Unsupported(format!(
                "--expert-profile-save {}: no expert cache (give --expert-cache N)",
                path.display()
            ))),
        }
    }

    /// Fills the expert cache's slots from an STRP profile (`--expert-profile`, most-routed
    /// first, per layer until its slots are full). Returns how many experts were copied.
    pub(crate) fn fill_expert_cache(&self, path: &std::path::Path, stacks: &dyn ExpertStacks) -> Result<usize> {
        let (Some(cache), n_expert @ 1..) = (&self.expert_cache, stacks.n_expert()) else {
            return Err(EngineError::Unsupported(format!(
                "--expert-profile {}: no expert cache to fill (the model has no routed experts, or --expert-cache leaves every expert resident)",
                path.display()
            )));
        };
        let api = self.ops.api();
        cache.fill_from_profile(path, n_expert, |l, e, slot| {
            for (dst, bytes) in stacks.expert_parts(l, e, slot).map_err(|err| err.to_string())? {
                api.memcpy_htod(dst, &bytes).map_err(|err| err.to_string())?;
            }
            Ok(())
        })
    }

    /// After a window of `n_tokens`: admits the experts whose copies (started at the previous
    /// window's end) have landed, then starts the copies of the experts the cache gives a slot
    /// now (adaptive swaps, deferred admissions) on the side stream (`experts::swap`).
    pub(crate) fn adapt_expert_cache(&self, n_tokens: usize, stacks: &dyn ExpertStacks) -> Result<()> {
        let Some(c) = &self.expert_cache else { return Ok(()) };
        let api = self.ops.api();
        let mut copies = self.swap_copies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sc) = copies.as_mut() {
            sc.land(&**api, c).map_err(gpu_err("expert swap copies"))?;
        }
        let swaps = c.end_window(n_tokens);
        if swaps.is_empty() {
            return Ok(());
        }
        let mut parts = Vec::new();
        for sw in &swaps {
            parts.extend(stacks.expert_parts(sw.layer, sw.expert, sw.slot)?);
        }
        let parts: Vec<(DevicePtr, &[u8])> = parts.iter().map(|(d, b)| (*d, &**b)).collect();
        let sc = match copies.as_mut() {
            Some(sc) => sc,
            None => copies.insert(SwapCopies::new(&**api).map_err(gpu_err("expert swap copies"))?),
        };
        sc.start(&**api, &self.stream, swaps, &parts).map_err(gpu_err("expert swap copies"))
    }

    /// Puts a new expert cache in place (`--expert-cache auto` after its fit): takes the fit's
    /// uploads (`allocs`, `bytes`), drops the copies in flight (they belong to the cache being
    /// replaced) and the old handoff; the caller makes the new cache's handoff after.
    pub(crate) fn replace_expert_cache(
        &mut self,
        mut allocs: Vec<DevicePtr>,
        bytes: usize,
        cache: Option<ExpertCache>,
    ) -> Result<()> {
        let api = self.ops.api().clone();
        self.allocs.append(&mut allocs);
        self.weight_bytes += bytes;
        if let Some(c) = self.swap_copies.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            c.free(&*api).map_err(gpu_err("expert swap copies"))?;
        }
        self.expert_cache = cache;
        if let Some(h) = self.handoff.take() {
            h.free(&*api).map_err(gpu_err("freeing the expert handoff"))?;
        }
        Ok(())
    }
}
