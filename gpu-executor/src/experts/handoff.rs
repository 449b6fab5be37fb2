//! The per-layer handoff between the device and the CPU for an expert cache (issue 12 item 4,
//! docs/expert-tiering.md): how a decode window whose experts do not all fit in VRAM still runs
//! as one captured graph.
//!
//! Per MoE layer, in stream order:
//! 1. the device publishes the layer's tag, the router's choice and the normed input into a
//!    mapped [`Mailbox`] (device → host);
//! 2. `moe_slot_map` looks the choice up in the device's copy of the slot table: hits get their
//!    slot, misses `MOE_SLOT_MISS` and a combine row in the host part of the output buffer;
//! 3. the hits run by device dispatch over the cache slots (misses skipped) while a host thread
//!    ([`ExpertHandoff::serve`]) computes the misses on the cache's CPU pool;
//! 4. the host writes all the layer's rows into the second mailbox (host → device) and rings;
//!    the device waits, copies them next to its own rows, and `moe_combine` weighs both alike.
//!
//! With `--pcie-frac F` (and the experts in RAM mapped for the device, `crate::experts::pcie`)
//! the host gives that share of the misses back to the device instead of computing them: its
//! answer carries, next to the rows, the ids of the experts the device is to read from RAM
//! (`MOE_SLOT_MISS` elsewhere), and a second dispatch after the doorbell writes their rows
//! where the host's would be.
//!
//! The host side must answer every layer of the window, even after an error (it then sends
//! zero rows and reports the error when the window ends): the device never waits for an answer
//! that does not come. The slot table on the device changes only between windows
//! ([`ExpertHandoff::sync_table`]), so admissions during a window are deferred
//! ([`ExpertCache::place_deferred`]).

use crate::abi::MAX_COLS;
use crate::device::{DevicePtr, GpuApi, GpuError, Mailbox, Stream};
use crate::experts::cache::ExpertCache;
use crate::experts::pcie::PcieExperts;
use crate::ops::GpuOps;
use crate::upload::DevMat;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes of the layer tag at the start of a published payload (padded to its own line).
const TAG_BYTES: usize = 64;

/// Mailboxes, the device's slot table and the layer tags of one model's expert cache.
pub struct ExpertHandoff {
    to_host: Mailbox,
    to_device: Mailbox,
    /// `[layer][expert]` u32: the expert's slot or `MOE_SLOT_MISS`.
    table: DevicePtr,
    /// `[layer]` u32: `0..n_layer` (each layer publishes its own, so a lost round shows).
    tags: DevicePtr,
    /// Version of the cache's slot table last copied to `table` (u64::MAX: never).
    synced: AtomicU64,
    /// Layers served, and microseconds the host thread waited for the device to publish.
    layers_served: AtomicU64,
    wait_us: AtomicU64,
    /// With `--pcie-frac`: the experts in RAM mapped for the device, and `[MAX_COLS · k]` u32
    /// of the experts it reads from there, per slot (the host's answer; `MOE_SLOT_MISS` for
    /// the others).
    pcie: Option<(PcieExperts, DevicePtr)>,
    /// The model's MoE layers, in the device's order: what a window publishes.
    moe_layers: Vec<usize>,
    n_expert: usize,
    k: usize,
    d: usize,
}

impl Published {
    /// The host's answer for this layer: the slots grouped by expert (ascending); of the
    /// experts without a slot (`ExpertCache::place_deferred`), the `--pcie-frac` share (most
    /// used first, [`ExpertCache::read_miss`]) goes back to the device to read from RAM and the
    /// others are computed by `expert(e, slots)` (its rows `[slots][d]`) on the cache's CPU
    /// pool, each row at its slot. An injected fault (`ExpertCache::inject_faults`) fails it.
    pub fn miss_rows(
        &self,
        cache: &ExpertCache,
        d: usize,
        expert: impl Fn(usize, &[usize]) -> Result<Vec<f32>, GpuError> + Sync,
    ) -> Result<Answer, GpuError> {
        cache
            .take_fault()
            .map_err(|what| GpuError::Launch { kernel: format!("CPU experts of layer {}", self.layer), what })?;
        let mut chosen: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (slot, &id) in self.ids.iter().enumerate() {
            chosen.entry(id as usize).or_default().push(slot);
        }
        let mut misses: Vec<(usize, Vec<usize>)> = chosen
            .into_iter()
            .filter(|(e, slots)| cache.place_deferred(self.layer, *e, slots.len()).is_none())
            .collect();
        let mut answer = Answer::none(self.ids.len(), d);
        if self.pcie {
            // Most used first (stable: ties by id), so the device reads those it saves most on.
            misses.sort_by_key(|(_, slots)| std::cmp::Reverse(slots.len()));
            misses.retain(|(e, slots)| {
                let read = cache.read_miss(slots.len());
                if read {
                    slots.iter().for_each(|&j| answer.on_device[j] = *e as u32);
                }
                !read
            });
        }
        if misses.is_empty() {
            return Ok(answer);
        }
        let outputs =
            cache.on_pool(|| misses.iter().map(|(e, slots)| expert(*e, slots)).collect::<Result<Vec<_>, _>>())?;
        for ((_, slots), ys) in misses.iter().zip(&outputs) {
            for (&j, row) in slots.iter().zip(ys.chunks_exact(d)) {
                answer.rows[j * d..(j + 1) * d].copy_from_slice(row);
            }
        }
        Ok(answer)
    }
}

/// The host's answer for one layer of a window of `n` tokens.
pub struct Answer {
    /// `[n·k][d]`: the rows the CPU computed (zero elsewhere).
    pub rows: Vec<f32>,
    /// `[n·k]`: the expert the device reads from RAM for this slot, or `MOE_SLOT_MISS`.
    pub on_device: Vec<u32>,
}

impl Answer {
    /// No rows and nothing for the device (what an error answers).
    pub fn none(slots: usize, d: usize) -> Answer {
        Answer { rows: vec![0f32; slots * d], on_device: vec![crate::abi::MOE_SLOT_MISS; slots] }
    }
}

/// The host side's work for one published layer ([`ExpertHandoff::serve`]).
pub type MissFn<'a> = dyn Fn(&Published) -> Result<Answer, GpuError> + Sync + 'a;

/// One layer as the host receives it.
pub struct Published {
    pub layer: usize,
    /// Whether misses may go back to the device (`--pcie-frac`, the experts mapped from RAM).
    pub pcie: bool,
    /// `[token·k + rank]` expert ids.
    pub ids: Vec<u32>,
    /// `[token][d]` normed input.
    pub x: Vec<f32>,
}

impl ExpertHandoff {
    /// The handoff of a model with `n_layer` layers, of which `moe_layers` have `n_expert`
    /// experts (`k` a token) on inputs of `d`, for windows of up to [`MAX_COLS`] tokens; with
    /// `pcie` (the experts in RAM mapped for the device), the host may hand misses back for
    /// the device to read from there.
    pub fn new(
        api: &dyn GpuApi,
        n_layer: usize,
        moe_layers: Vec<usize>,
        n_expert: usize,
        k: usize,
        d: usize,
        pcie: Option<PcieExperts>,
    ) -> Result<ExpertHandoff, GpuError> {
        let to_host = Mailbox::new(api, Self::ids_bytes(k) + MAX_COLS * d * 4 + TAG_BYTES)?;
        let to_device = Mailbox::new(api, MAX_COLS * k * (d * 4 + if pcie.is_some() { 4 } else { 0 }))?;
        let pcie = match pcie {
            Some(p) => Some((p, api.malloc(MAX_COLS * k * 4)?)),
            None => None,
        };
        let table = api.malloc(n_layer * n_expert * 4)?;
        api.memcpy_htod(table, &vec![0xffu8; n_layer * n_expert * 4])?;
        let tags = api.malloc(n_layer * 4)?;
        let t: Vec<u8> = (0..n_layer as u32).flat_map(u32::to_le_bytes).collect();
        api.memcpy_htod(tags, &t)?;
        Ok(ExpertHandoff {
            to_host,
            to_device,
            table,
            tags,
            pcie,
            synced: AtomicU64::new(u64::MAX),
            layers_served: AtomicU64::new(0),
            wait_us: AtomicU64::new(0),
            moe_layers,
            n_expert,
            k,
            d,
        })
    }

    /// Payload bytes of a window's ids (padded so the input starts on its own line).
    fn ids_bytes(k: usize) -> usize {
        (MAX_COLS * k * 4).next_multiple_of(64)
    }

    /// Why the mailboxes are not host-mapped, when they are the fallback in device memory.
    pub fn fallback(&self) -> Option<&str> {
        self.to_host.fallback().or(self.to_device.fallback())
    }

    /// Copies the cache's slot table to the device when it changed (between windows only).
    fn sync_table(&self, api: &dyn GpuApi, cache: &ExpertCache) -> Result<(), GpuError> {
        if self.synced.load(Ordering::Acquire) == cache.version() {
            return Ok(());
        }
        let (table, v) = cache.slot_table();
        let bytes: Vec<u8> = table.iter().flat_map(|s| s.to_le_bytes()).collect();
        api.memcpy_htod(self.table, &bytes)?;
        self.synced.store(v, Ordering::Release);
        Ok(())
    }

    /// Device side, first half (capturable): publishes `layer`'s choice `ids` and input `x` for
    /// `n` tokens, and maps the choice through the slot table into `slots` (what device dispatch
    /// reads) and `map` (the combine's rows: `j` for a hit, `miss_base + j` for a miss).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish(
        &self,
        ops: &GpuOps,
        st: &Stream,
        layer: usize,
        n: usize,
        ids: DevicePtr,
        x: DevicePtr,
        slots: DevicePtr,
        map: DevicePtr,
        miss_base: usize,
    ) -> Result<(), GpuError> {
        let (k, d) = (self.k, self.d);
        let parts = [
            (0, self.tags + (layer * 4) as u64, 4),
            (TAG_BYTES, ids, n * k * 4),
            (TAG_BYTES + Self::ids_bytes(k), x, n * d * 4),
        ];
        self.to_host.device_send_parts(&**ops.api(), st, &parts)?;
        let row = self.table + (layer * self.n_expert * 4) as u64;
        ops.moe_slot_map(st, ids, row, slots, map, (n * k) as u32, self.n_expert as u32, miss_base as u32)
    }

    /// Device side, second half (capturable): waits for the host's rows of the layer and copies
    /// them to `rows` (`[n·k][d]`, the part `miss_base` pointed the map at), and with
    /// `--pcie-frac` the ids of the experts to read from RAM for the second dispatch ([`ExpertHandoff::pcie_layer`]).
    pub(crate) fn receive(&self, api: &dyn GpuApi, st: &Stream, n: usize, rows: DevicePtr) -> Result<(), GpuError> {
        let row_bytes = n * self.k * self.d * 4;
        match self.pcie {
            Some((_, ids)) => {
                self.to_device.device_recv_parts(api, st, &[(0, rows, row_bytes), (row_bytes, ids, n * self.k * 4)])
            }
            None => self.to_device.device_recv(api, st, rows, row_bytes),
        }
    }

    /// For `--pcie-frac`: `layer`'s expert stacks in RAM as the device reads them, and where
    /// [`ExpertHandoff::receive`] puts the ids of the experts to read (what the second
    /// dispatch, after the receive, takes). None without `--pcie-frac`.
    pub(crate) fn pcie_layer(&self, layer: usize) -> Option<(&[DevMat; 3], DevicePtr)> {
        self.pcie.as_ref().and_then(|(p, ids)| Some((p.layer(layer)?, *ids)))
    }

    /// Host side of a window of `n` tokens: for each MoE layer in `layers` (in the device's
    /// order), receives what the device published, runs `misses` (the rows of the slots the
    /// device skips, `[n·k][d]`; others are ignored) and sends the rows back. An error of
    /// `misses` still answers (zero rows) so the device goes on; the first error is returned
    /// at the end. Gives up when `cancel` is set (the device side failed).
    pub fn serve(
        &self,
        api: &dyn GpuApi,
        layers: &[usize],
        n: usize,
        cancel: &AtomicBool,
        misses: &MissFn<'_>,
    ) -> Result<(), GpuError> {
        let (k, d) = (self.k, self.d);
        let ids_at = TAG_BYTES;
        let x_at = TAG_BYTES + Self::ids_bytes(k);
        let mut first_err = None;
        for &layer in layers {
            let waited = std::time::Instant::now();
            let raw = self.to_host.host_recv_until(api, x_at + n * d * 4, Some(cancel))?;
            self.wait_us.fetch_add(waited.elapsed().as_micros() as u64, Ordering::Relaxed);
            self.layers_served.fetch_add(1, Ordering::Relaxed);
            let u32s = |b: &[u8]| {
                b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<u32>>()
            };
            let tag = u32s(&raw[..4])[0] as usize;
            let p = Published {
                layer,
                pcie: self.pcie_layer(layer).is_some(),
                ids: u32s(&raw[ids_at..ids_at + n * k * 4]),
                x: raw[x_at..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            };
            let rows = if tag != layer {
                Err(GpuError::Capture(format!(
                    "expert handoff: the device published layer {tag} where layer {layer} was due"
                )))
            } else if let Some(&bad) = p.ids.iter().find(|&&e| e as usize >= self.n_expert) {
                Err(GpuError::Launch {
                    kernel: "moe_router".into(),
                    what: format!("layer {layer}: selected expert {bad} of {}", self.n_expert),
                })
            } else {
                misses(&p).and_then(|a| {
                    if a.rows.len() != n * k * d {
                        Err(GpuError::Capture(format!(
                            "expert handoff: layer {layer}: {} values for {} rows of {d}",
                            a.rows.len(),
                            n * k
                        )))
                    } else if a.on_device.len() != n * k {
                        Err(GpuError::Capture(format!(
                            "expert handoff: layer {layer}: {} device ids for {} slots",
                            a.on_device.len(),
                            n * k
                        )))
                    } else {
                        Ok(a)
                    }
                })
            };
            let answer = rows.unwrap_or_else(|e| {
                first_err.get_or_insert(e);
                Answer::none(n * k, d)
            });
            let mut bytes: Vec<u8> = answer.rows.iter().flat_map(|v| v.to_le_bytes()).collect();
            if self.pcie.is_some() {
                bytes.extend(answer.on_device.iter().flat_map(|v| v.to_le_bytes()));
            }
            self.to_device.host_send_until(api, &bytes, Some(cancel))?;
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Runs `device` (the window's launches or graph replay) while [`ExpertHandoff::serve`]
    /// answers its MoE layers on another thread, after copying `cache`'s slot table to the
    /// device if it changed; the mailboxes are reset after a failure so the next window starts
    /// clean. A host-side failure becomes the caller's error by `host_err`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_window<R, E>(
        &self,
        api: &dyn GpuApi,
        st: &Stream,
        cache: &ExpertCache,
        n: usize,
        device: impl FnOnce() -> Result<R, E>,
        misses: &MissFn<'_>,
        host_err: impl Fn(GpuError) -> E,
    ) -> Result<R, E> {
        self.sync_table(api, cache).map_err(&host_err)?;
        let layers = &self.moe_layers[..];
        // After a device failure the host thread stops waiting for layers that never come.
        let ran = crate::device::handoff::alongside(
            api,
            st,
            "strata-handoff",
            |cancel| self.serve(api, layers, n, cancel, misses),
            device,
        );
        let (r, served) = match ran {
            Ok(pair) => pair,
            Err(why) => {
                self.reset(api, st).map_err(&host_err)?;
                return Err(host_err(GpuError::Capture(format!("expert handoff: {why}"))));
            }
        };
        if r.is_err() || served.is_err() {
            self.reset(api, st).map_err(&host_err)?;
        }
        let r = r?;
        served.map_err(host_err)?;
        Ok(r)
    }

    /// After a failed window: once the device is done with the words (every layer it published
    /// was answered), both mailboxes start clean.
    fn reset(&self, api: &dyn GpuApi, st: &Stream) -> Result<(), GpuError> {
        let _ = api.stream_synchronize(st);
        self.to_host.reset(api)?;
        self.to_device.reset(api)
    }

    /// `stats` with the handoff's counters (layers served, host wait).
    pub fn add_stats(&self, mut stats: experts::counters::CacheStats) -> experts::counters::CacheStats {
        stats.handoff_layers = self.layers_served.load(Ordering::Relaxed);
        stats.handoff_wait_ms = self.wait_us.load(Ordering::Relaxed) as f64 / 1000.0;
        stats
    }

    /// Releases the device memory.
    pub fn free(self, api: &dyn GpuApi) -> Result<(), GpuError> {
        self.to_host.free(api)?;
        self.to_device.free(api)?;
        if let Some((p, ids)) = self.pcie {
            api.free(ids)?;
            p.free(api)?;
        }
        api.free(self.table)?;
        api.free(self.tags)
    }
}
