//! Experts the device reads straight from RAM over PCIe (`--pcie-frac F` in the handoff's decode
//! windows, issue 12 item 4; docs/expert-tiering.md).
//!
//! The experts the CPU pool computes from already sit in host memory, stored as the device's
//! dispatch kernels read them (`mmvq_moe_*` take GGUF blocks as stored). Pinning those pages and
//! mapping them into the device's address space ([`GpuApi::host_register`]) lets a captured
//! graph run a miss on the device with no copy and no host round trip: the host thread of the
//! handoff names the experts the device should read, in the same answer that carries the CPU's
//! rows, and a second dispatch after the doorbell reads them from RAM. Nothing is staged, so
//! nothing waits for a copy and no slot is borrowed.
//!
//! The registration is made once at load, over page-disjoint spans (two registrations never
//! share a page, which HIP would refuse).

use crate::device::{GpuApi, GpuError, HostRegion};
use crate::upload::DevMat;

const PAGE: usize = 4096;

/// The host copies of every MoE layer's expert stacks, mapped for the device.
pub struct PcieExperts {
    regions: Vec<HostRegion>,
    /// `[layer]`: gate, up and down of all the layer's experts as device views (expert `e` at
    /// `e · mat_bytes`, like a cache's stacks), or None for a layer without routed experts.
    layers: Vec<Option<[DevMat; 3]>>,
}

/// One layer's gate, up and down for [`PcieExperts::register`]: the host bytes of all its
/// experts (back to back) and the device stack whose layout they share.
pub(crate) type HostStacks<'a> = [(&'a [u8], DevMat); 3];

impl PcieExperts {
    /// Maps `stacks` (per layer) for the device. The bytes must outlive the result and never
    /// change (weights of the model that owns it). A stack whose bytes are not `n · mat_bytes`
    /// long, or a registration the device refuses, is an error naming the layer.
    pub(crate) fn register(api: &dyn GpuApi, stacks: &[Option<HostStacks<'_>>]) -> Result<PcieExperts, GpuError> {
        let bad = |what: String| GpuError::Launch { kernel: "--pcie-frac".into(), what };
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (layer, l) in stacks.iter().enumerate() {
            for (bytes, d) in l.iter().flatten() {
                if d.mat_bytes == 0 || bytes.len() % d.mat_bytes != 0 {
                    return Err(bad(format!(
                        "layer {layer}: {} expert bytes are not whole experts of {} bytes",
                        bytes.len(),
                        d.mat_bytes
                    )));
                }
                spans.push((bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len()));
            }
        }
        let merged = page_disjoint(spans);
        let mut regions = Vec::with_capacity(merged.len());
        for &(start, end) in &merged {
            // SAFETY: every span is covered by slices the caller holds (contiguous pages of its
            // weights, the bytes between two of its slices inside pages they share), which
            // outlive the registration and never change.
            match unsafe { api.host_register(start as *const u8, end - start) } {
                Ok(r) => regions.push(r),
                Err(e) => {
                    for r in regions {
                        let _ = api.host_unregister(r);
                    }
                    return Err(bad(format!(
                        "mapping {} MiB of experts in RAM for the device: {e} (--pcie-frac 0 leaves every miss to the CPU pool)",
                        (end - start) >> 20
                    )));
                }
            }
        }
        let device_addr = |p: usize| {
            let i = merged.partition_point(|&(s, _)| s <= p) - 1;
            regions[i].device_ptr + (p - merged[i].0) as u64
        };
        let layers = stacks
            .iter()
            .map(|l| l.as_ref().map(|s| s.map(|(bytes, d)| DevMat { ptr: device_addr(bytes.as_ptr() as usize), ..d })))
            .collect();
        Ok(PcieExperts { regions, layers })
    }

    /// Layer `layer`'s expert stacks in host memory, as the device reads them.
    pub(crate) fn layer(&self, layer: usize) -> Option<&[DevMat; 3]> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// Bytes pinned and mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.regions.iter().map(|r| r.bytes).sum()
    }

    /// Ends the registrations (after the device is done with them).
    pub fn free(self, api: &dyn GpuApi) -> Result<(), GpuError> {
        self.regions.into_iter().try_for_each(|r| api.host_unregister(r))
    }
}

/// Merges byte spans `[start, end)` so that no two results touch a common page; each result
/// runs from its first span's start to its last span's end.
fn page_disjoint(mut spans: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    spans.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s / PAGE <= last.1.div_ceil(PAGE) => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_sharing_or_touching_a_page_merge_and_others_stay_apart() {
        let p = PAGE;
        let got = page_disjoint(vec![
            (10 * p + 100, 11 * p + 5),
            (3 * p, 4 * p),
            (11 * p + 64, 12 * p),
            (12 * p + 8, 13 * p),
            (20 * p, 21 * p),
        ]);
        assert_eq!(got, vec![(3 * p, 4 * p), (10 * p + 100, 13 * p), (20 * p, 21 * p)]);
        // Starting on the page right after an end (it ends mid-page): same page boundary, merged.
        assert_eq!(page_disjoint(vec![(0, p + 1), (2 * p, 3 * p)]), vec![(0, 3 * p)]);
        // A whole free page between them: apart.
        assert_eq!(page_disjoint(vec![(0, p), (2 * p, 3 * p)]), vec![(0, p), (2 * p, 3 * p)]);
    }
}
