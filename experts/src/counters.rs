//! The expert cache's counters (`gpu::experts::cache`), plain data so that every build (with or
//! without the GPU backend) can report them: `generate`'s counter line, `strata bench`, the
//! `--serve` done line.

/// Counters of the cache since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CacheStats {
    /// Slots per MoE layer.
    pub slots: usize,
    /// Routing decisions (token, chosen expert).
    pub lookups: u64,
    /// Decisions whose expert held a slot.
    pub hits: u64,
    /// Experts copied into a free slot on first use.
    pub admitted: u64,
    /// Decisions computed on the CPU (their expert had no slot and none was free).
    pub cpu: u64,
    /// Experts put into slots at start from `--expert-profile`.
    pub preloaded: u64,
    /// Experts copied in by adaptive residency (`--adapt-every N`), each replacing a less-routed
    /// resident or taking a free slot.
    pub swapped: u64,
    /// Decisions computed on the device instead of the CPU (prompt chunks, `--pcie-frac`), and
    /// the experts copied to the staging ring for them.
    pub streamed: u64,
    pub streamed_experts: u64,
    /// Experts the device read from RAM over PCIe instead of the CPU computing them
    /// (`--pcie-frac` in decode windows through the handoff), and their bytes.
    pub pcie_read_experts: u64,
    pub pcie_read_bytes: u64,
    /// Bytes copied into VRAM (preloads, admissions, swaps, staging: over PCIe on a card).
    pub copied_bytes: u64,
    /// Time the CPU pool spent on experts, and its workers.
    pub cpu_ms: f64,
    pub pool_workers: usize,
    /// Layers whose experts went through the per-layer handoff (decode graphs; 0 on the
    /// host-readback path), and the time its host thread waited for the device to publish them.
    pub handoff_layers: u64,
    pub handoff_wait_ms: f64,
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = if self.lookups == 0 { 0.0 } else { 100.0 * self.hits as f64 / self.lookups as f64 };
        write!(
            f,
            "expert cache: {} hits / {} lookups ({pct:.1}%), {} preloaded from the profile, {} admitted on first use, {} swapped in ({} copied to VRAM), {} computed on the CPU ({:.1} ms, {} worker{}); {} slots per layer",
            self.hits,
            self.lookups,
            self.preloaded,
            self.admitted,
            self.swapped,
            indicatif::HumanBytes(self.copied_bytes),
            self.cpu,
            self.cpu_ms,
            self.pool_workers,
            if self.pool_workers == 1 { "" } else { "s" },
            self.slots
        )?;
        if self.streamed > 0 {
            write!(f, "; {} computed on the device instead", self.streamed)?;
            if self.streamed_experts > 0 {
                write!(f, ", {} experts copied to a staging slot", self.streamed_experts)?;
            }
            if self.pcie_read_experts > 0 {
                write!(
                    f,
                    ", {} experts read from RAM over PCIe ({})",
                    self.pcie_read_experts,
                    indicatif::HumanBytes(self.pcie_read_bytes)
                )?;
            }
        }
        if self.handoff_layers > 0 {
            write!(
                f,
                "; {} layer handoffs ({:.1} ms waiting for the device)",
                self.handoff_layers, self.handoff_wait_ms
            )?;
        }
        Ok(())
    }
}
