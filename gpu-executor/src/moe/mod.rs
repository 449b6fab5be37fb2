//! The routed-expert FFN on the device: the steps both model families run, whatever their
//! layer around it. After the router (`moe_router`) the choice either stays on the device
//! (device dispatch: `mmvq_moe_*` read it; launch-only, graph-capturable), goes through the
//! expert cache's per-layer handoff ([`experts_by_handoff`]: hits by device dispatch over the
//! cache slots, misses from the host thread), or is read back ([`read_choice`]) and each chosen
//! expert placed ([`place_chosen`]: its resident copy, a cache slot, the staging ring or the
//! CPU pool). `moe_combine` then adds each token's rows in rank order.
//!
//! The families' layers ([`decoder`] for the shared decoder's `GpuModel`, and
//! `qwen4exp::exec::moe` for Flash-Next's window, which adds the sigmoid-gated shared expert)
//! keep only what differs: their scratch buffers, their weights and their CPU-pool products.

mod decoder;

use super::device::{DevicePtr, GpuApi, GpuError, Stream};
use super::experts::cache::{ExpertCache, Placement};
use super::experts::handoff::ExpertHandoff;
use super::linear::{DispatchBuffers, Linear};
use super::upload::DevMat;

/// The shared activations of an expert chosen by one token (`slots` are `token·k + rank`), if
/// the layer's tokens were quantized once for all the experts the CPU computes.
pub(crate) fn one_token<'s>(
    shared: &'s [cpu_executor::ExpertActs],
    slots: &[usize],
    k: usize,
) -> Option<&'s cpu_executor::ExpertActs> {
    match slots {
        [j] => shared.get(j / k),
        _ => None,
    }
}

/// The router's choice read back from `ids` (`n·k` expert ids, slot `token·k + rank`) once
/// the stream is idle, each checked against `n_expert`: a bad id is an error, never an
/// out-of-bounds expert.
pub(crate) fn read_choice(
    api: &dyn GpuApi,
    st: &Stream,
    ids: DevicePtr,
    n: usize,
    k: usize,
    n_expert: usize,
) -> Result<Vec<u32>, GpuError> {
    api.stream_synchronize(st)?;
    let mut b = vec![0u8; n * k * 4];
    api.memcpy_dtoh(&mut b, ids)?;
    let sel: Vec<u32> = b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    match sel.iter().find(|&&e| e as usize >= n_expert) {
        Some(&bad) => {
            Err(GpuError::Launch { kernel: "moe_router".into(), what: format!("selected expert {bad} of {n_expert}") })
        }
        None => Ok(sel),
    }
}

/// How many distinct experts a choice names (profiling: the expert weights the device read).
pub(crate) fn distinct(sel: &[u32]) -> usize {
    let mut ids = sel.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

/// Where a chosen expert runs when the choice is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runs {
    /// From the device stacks, at this index: the expert id with every expert resident, its
    /// cache slot otherwise (already filled, or just filled by the caller's `admit`).
    Device(usize),
    /// From a slot of the staging ring, copied there for this layer.
    Staged,
    /// On the expert cache's CPU pool.
    Cpu,
}

/// One expert of a read-back choice: its id, the slots (`token·k + rank`) that chose it, in
/// order, and where it runs.
pub(crate) struct Chosen {
    pub expert: usize,
    pub slots: Vec<usize>,
    pub runs: Runs,
}

/// Places each expert of `sel` (read back, checked against `n_expert`) for `layer`, in
/// expert order as the cache is asked ([`ExpertCache::place`]). Without a cache every expert
/// runs from its resident copy. An expert admitted into a free slot is copied there by
/// `admit(expert, slot)` before anything reads it. With a staging ring the misses are then
/// offered to [`ExpertCache::stream_miss`] most-used first (all of a prompt chunk's stream:
/// copying an expert over PCIe costs less than the CPU computing it for many tokens; a decode
/// window streams its `--pcie-frac` share), the rest run on the CPU pool.
pub(crate) fn place_chosen<E>(
    sel: &[u32],
    n_expert: usize,
    layer: usize,
    cache: Option<&ExpertCache>,
    staging: bool,
    prompt: bool,
    mut admit: impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<Vec<Chosen>, E> {
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (j, &e) in sel.iter().enumerate() {
        by_expert[e as usize].push(j);
    }
    let mut chosen = Vec::new();
    for (expert, slots) in by_expert.into_iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let runs = match cache.map(|c| c.place(layer, expert, slots.len())) {
            None => Runs::Device(expert),
            Some(Placement::Hit(s)) => Runs::Device(s),
            Some(Placement::Admit(s)) => {
                admit(expert, s)?;
                Runs::Device(s)
            }
            Some(Placement::Cpu) => Runs::Cpu,
        };
        chosen.push(Chosen { expert, slots, runs });
    }
    if let (Some(c), true) = (cache, staging) {
        let mut misses: Vec<usize> = (0..chosen.len()).filter(|&i| chosen[i].runs == Runs::Cpu).collect();
        misses.sort_by_key(|&i| (std::cmp::Reverse(chosen[i].slots.len()), chosen[i].expert));
        for i in misses {
            if c.stream_miss(chosen[i].slots.len(), prompt) {
                chosen[i].runs = Runs::Staged;
            }
        }
    }
    Ok(chosen)
}

/// The device buffers of one layer's handoff.
pub(crate) struct HandoffBuffers {
    /// The router's choice (expert ids, `[n·k]`) and the normed input rows (f32) the host
    /// reads for the misses.
    pub ids: DevicePtr,
    pub x: DevicePtr,
    /// The choice as cache slots (`abi::MOE_SLOT_MISS` for a miss) and the combine's map.
    pub slots: DevicePtr,
    pub map: DevicePtr,
    /// The first row of `dispatch.y` the host's rows land at (after the window's own rows).
    pub miss_base: usize,
    /// The dispatch buffers of the cache slots' run (`ids` unused: `slots` is read).
    pub dispatch: DispatchBuffers,
}

/// Routed experts of `layer` for `n` tokens through the expert cache's handoff, the input
/// already quantized in `b.dispatch.xq`: publishes the choice and input to the host thread,
/// runs the hits by device dispatch over the cache slots of `stacks`, receives the host's rows
/// of the misses (at `b.miss_base`) and, with `--pcie-frac`, runs the misses the host gave back
/// by device dispatch from their stacks in RAM. Nothing is read back, so the window can be a
/// graph; the combine's map is then `b.map`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn experts_by_handoff(
    lin: &Linear<'_>,
    h: &ExpertHandoff,
    cache: &ExpertCache,
    layer: usize,
    n: usize,
    [k, n_expert, d]: [usize; 3],
    stacks: [&DevMat; 3],
    b: &HandoffBuffers,
) -> Result<(), GpuError> {
    h.publish(lin.ops, lin.stream, layer, n, b.ids, b.x, b.slots, b.map, b.miss_base)?;
    if cache.slots() > 0 {
        lin.experts_by_dispatch(stacks, cache.slots(), k, n, &DispatchBuffers { ids: b.slots, ..b.dispatch })?;
    }
    let host_rows = b.dispatch.y + (b.miss_base * d * 4) as u64;
    h.receive(&**lin.ops.api(), lin.stream, n, host_rows)?;
    if let Some(([pg, pu, pd], ids)) = h.pcie_layer(layer) {
        // The misses the host gave back: read from RAM, their rows where the host's would be.
        let db = DispatchBuffers { ids, y: host_rows, ..b.dispatch };
        lin.experts_by_dispatch([pg, pu, pd], n_expert, k, n, &db)?;
    }
    Ok(())
}
