//! Expert-tiering projection (`strata plan`): how a MoE model splits over one GPU, RAM and a
//! CPU pool, and the decode speed that split allows. Pure arithmetic over a [`ModelShape`]
//! (read from a GGUF's tensor directory, or the built-in Flash-Next shape), a [`Machine`] and a
//! hit rate (from a routing trace through the cache policies), so it runs without a GPU.
//!
//! Cost model of one decode token (no speculation), per MoE layer, GPU and CPU in parallel:
//! - GPU: the layer's dense weights and the hit experts' bytes, at the card's bandwidth times
//!   an efficiency (the kernels' bytes over ideal, and how close decode kernels get to peak);
//! - CPU: the missed experts' bytes, at the pool's rate (workers x a measured per-core rate,
//!   capped by the RAM bandwidth);
//! - the layer takes the longer of the two plus one handoff (publish, ring, wait);
//! - the head (and anything outside the MoE layers) runs on the GPU alone.

use gguf::GgufFile;

const GIB: f64 = (1u64 << 30) as f64;

/// What the projection needs to know about a MoE model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub name: String,
    pub n_layers: usize,
    /// Layers with routed experts.
    pub n_moe_layers: usize,
    pub n_expert: usize,
    /// Experts per token.
    pub k: usize,
    /// One expert's gate, up and down, in bytes as stored.
    pub expert_bytes: u64,
    /// Weights every token reads on the GPU (everything but the routed experts, the embedding
    /// table, from which one row is gathered, and the PLE table, which stays on the host).
    pub dense_bytes: u64,
    /// Weights resident in VRAM besides the experts (`dense_bytes` plus the embedding table).
    pub resident_bytes: u64,
    /// KV cache bytes per position (all attention layers, K and V).
    pub kv_bytes_per_pos: u64,
    /// Recurrent state read and written per token (GDN layers' fp32 delta-rule states).
    pub state_bytes_per_token: u64,
}

impl ModelShape {
    /// The shape of a GGUF model (every shard) from its tensor directory: types and shapes only,
    /// no weights read. Errors name what is missing.
    pub fn from_gguf(g: &GgufFile, name: &str, kv_elem_bytes: f64) -> Result<ModelShape, String> {
        let arch = g.architecture().map_err(|e| e.to_string())?.to_string();
        let key = |k: &str| g.get_u64(&format!("{arch}.{k}")).map_err(|e| e.to_string());
        let n_layers = key("block_count")? as usize;
        let n_expert = key("expert_count").map_err(|e| format!("{e}: not a MoE model"))? as usize;
        let k = key("expert_used_count")? as usize;
        let (mut experts, mut dense, mut gathered, mut kv_rows) = (0u64, 0u64, 0u64, 0u64);
        let mut moe_layers = std::collections::BTreeSet::new();
        for t in g.tensors() {
            let bytes =
                t.ty.row_bytes(t.dims[0] as usize).map_or(0, |r| r as u64) * t.dims.iter().skip(1).product::<u64>();
            let layer = t.block();
            if t.name.contains("_exps.") {
                experts += bytes;
                moe_layers.extend(layer);
            } else if t.name == "token_embd.weight" {
                gathered += bytes;
            } else if t.name.starts_with("per_layer_token_embd") {
                // The PLE table: read by rows on the host (SSD or RAM), never on the device.
            } else {
                dense += bytes;
                if t.name.ends_with("attn_k.weight") || t.name.ends_with("attn_v.weight") {
                    kv_rows += t.dims.get(1).copied().unwrap_or(0);
                }
            }
        }
        if moe_layers.is_empty() {
            return Err("no routed expert tensors (blk.N.ffn_*_exps.weight)".into());
        }
        let expert_bytes = experts / (moe_layers.len() * n_expert) as u64;
        Ok(ModelShape {
            name: name.to_string(),
            n_layers,
            n_moe_layers: moe_layers.len(),
            n_expert,
            k,
            expert_bytes,
            dense_bytes: dense,
            resident_bytes: dense + gathered,
            kv_bytes_per_pos: (kv_rows as f64 * kv_elem_bytes) as u64,
            // Not derived from a header yet (the GDN head sizes are hyperparameters).
            state_bytes_per_token: 0,
        })
    }

    /// Qwen3.8-Flash-Next with IQ3_XXS experts, from the published figures
    /// (docs/expert-tiering.md): 48 layers, 512 experts of 3 x 640 x 2560 weights at
    /// 3.0625 bits, top-10, about 6 B active parameters per token. The dense weights are the
    /// active parameters minus the routed ones (2.36 B) at `dense_bits` per weight; the
    /// embedding table is 248,320 x 2560 at the same width; the KV cache covers the 12 QSA layers
    /// (2 KV heads of 256, K and V); the 36 GDN layers read and write 48 fp32 states of 128 x 128.
    pub fn qwen4exp_iq3xxs(dense_bits: f64, kv_elem_bytes: f64) -> ModelShape {
        let expert_weights = 3.0 * 640.0 * 2560.0;
        let routed = 48.0 * 10.0 * expert_weights;
        let dense_params = 6.0e9 - routed;
        let embd = 248_320.0 * 2560.0 * dense_bits / 8.0;
        let dense = dense_params * dense_bits / 8.0;
        ModelShape {
            name: "Flash-Next IQ3_XXS (built-in shape)".into(),
            n_layers: 48,
            n_moe_layers: 48,
            n_expert: 512,
            k: 10,
            expert_bytes: (expert_weights * 3.0625 / 8.0) as u64,
            dense_bytes: dense as u64,
            resident_bytes: (dense + embd) as u64,
            kv_bytes_per_pos: (12.0 * 2.0 * 2.0 * 256.0 * kv_elem_bytes) as u64,
            state_bytes_per_token: 36 * 48 * 128 * 128 * 4 * 2,
        }
    }
}

/// The machine the projection is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    pub vram_bytes: u64,
    pub gpu_gbs: f64,
    /// Share of the card's bandwidth decode kernels reach.
    pub gpu_efficiency: f64,
    pub pool_workers: usize,
    /// One CPU core's rate on the expert type, GB of weights per second.
    pub cpu_core_gbs: f64,
    /// RAM bandwidth, GB/s: the pool cannot stream experts faster.
    pub ram_gbs: f64,
    pub ram_bytes: u64,
    /// One layer's GPU → CPU → GPU handoff, microseconds.
    pub handoff_us: f64,
    /// Host-to-device link rate, GB/s, and the share of misses the card reads over it
    /// (`--pcie-frac`).
    pub pcie_gbs: f64,
    pub pcie_frac: f64,
}

/// The VRAM split and the projected decode speed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Projection {
    pub kv_bytes: u64,
    pub reserve_bytes: u64,
    pub extra_bytes: u64,
    /// Slots per MoE layer (the expert count when all fit).
    pub slots: usize,
    pub cached_bytes: u64,
    /// Experts that stay in RAM (or mapped from the SSD), and whether they fit in RAM.
    pub ram_expert_bytes: u64,
    pub fits_ram: bool,
    pub hit_rate: f64,
    pub gpu_ms: f64,
    pub cpu_ms: f64,
    /// The card reading its share of the misses from RAM (`--pcie-frac`), part of the GPU side's
    /// time.
    pub pcie_ms: f64,
    pub handoff_ms: f64,
    pub token_ms: f64,
    pub tokens_per_s: f64,
}

/// Slots per layer for `m` on `mc` with `ctx` positions, `reserve` and `extra` bytes kept free.
pub fn slots(m: &ModelShape, mc: &Machine, ctx: usize, reserve: u64, extra: u64) -> usize {
    let used = m.resident_bytes + m.kv_bytes_per_pos * ctx as u64 + reserve + extra;
    let per_slot = m.expert_bytes * m.n_moe_layers as u64;
    (mc.vram_bytes.saturating_sub(used) / per_slot.max(1)).min(m.n_expert as u64) as usize
}

/// The projection with `slots` per layer hitting at `hit_rate` (from the policy simulation).
pub fn project(
    m: &ModelShape,
    mc: &Machine,
    ctx: usize,
    reserve: u64,
    extra: u64,
    slots: usize,
    hit_rate: f64,
) -> Projection {
    let gpu_rate = mc.gpu_gbs * 1e9 * mc.gpu_efficiency; // bytes/s
    let cpu_rate = (mc.pool_workers as f64 * mc.cpu_core_gbs).min(mc.ram_gbs) * 1e9;
    let per_layer_experts = (m.k as u64 * m.expert_bytes) as f64;
    let moe_share = m.n_moe_layers as f64 / m.n_layers.max(1) as f64;
    // Dense weights are spread over the layers; the part outside the MoE layers (and the head)
    // runs on the GPU alone.
    let dense_layer = m.dense_bytes as f64 * moe_share / m.n_moe_layers.max(1) as f64;
    let dense_rest = m.dense_bytes as f64 * (1.0 - moe_share);
    // A half-full cache on average, and the recurrent states.
    let kv_read = (m.kv_bytes_per_pos * ctx as u64 / 2 + m.state_bytes_per_token) as f64;
    // Misses: share `pcie_frac` read by the card in place from RAM over the link (decode
    // windows through the handoff, gpu-executor/src/experts/pcie.rs: no copy, the link is the bound), the rest
    // on the CPU pool.
    let missed = (1.0 - hit_rate) * per_layer_experts;
    let streamed = mc.pcie_frac.clamp(0.0, 1.0) * missed;
    let pcie_layer = streamed / (mc.pcie_gbs * 1e9).max(1.0);
    let gpu_layer = (dense_layer + hit_rate * per_layer_experts) / gpu_rate + pcie_layer;
    let cpu_layer = (missed - streamed) / cpu_rate.max(1.0);
    let handoff = if hit_rate < 1.0 { mc.handoff_us * 1e-6 } else { 0.0 };
    let layers = m.n_moe_layers as f64 * (gpu_layer.max(cpu_layer) + handoff);
    let token = layers + (dense_rest + kv_read) / gpu_rate;
    let cached = slots as u64 * m.expert_bytes * m.n_moe_layers as u64;
    let ram_experts = (m.n_expert - slots) as u64 * m.expert_bytes * m.n_moe_layers as u64;
    Projection {
        kv_bytes: m.kv_bytes_per_pos * ctx as u64,
        reserve_bytes: reserve,
        extra_bytes: extra,
        slots,
        cached_bytes: cached,
        ram_expert_bytes: ram_experts,
        fits_ram: ram_experts < mc.ram_bytes.saturating_sub(8 << 30),
        hit_rate,
        gpu_ms: m.n_moe_layers as f64 * gpu_layer * 1e3 + (dense_rest + kv_read) / gpu_rate * 1e3,
        cpu_ms: m.n_moe_layers as f64 * cpu_layer * 1e3,
        pcie_ms: m.n_moe_layers as f64 * pcie_layer * 1e3,
        handoff_ms: m.n_moe_layers as f64 * handoff * 1e3,
        token_ms: token * 1e3,
        tokens_per_s: 1.0 / token,
    }
}

/// GiB, for printing.
pub fn gib(b: u64) -> f64 {
    b as f64 / GIB
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Machine {
        Machine {
            vram_bytes: 24 << 30,
            gpu_gbs: 960.0,
            gpu_efficiency: 0.5,
            pool_workers: 15,
            cpu_core_gbs: 8.0,
            ram_gbs: 60.0,
            ram_bytes: 64 << 30,
            handoff_us: 20.0,
            pcie_gbs: 25.0,
            pcie_frac: 0.0,
        }
    }

    #[test]
    fn qwen4exp_shape_matches_the_published_arithmetic() {
        let m = ModelShape::qwen4exp_iq3xxs(6.5625, 1.0);
        assert_eq!(m.expert_bytes, 1_881_600, "3 x 640 x 2560 x 3.0625 bits");
        let all = m.expert_bytes * 512 * 48;
        assert!((gib(all) - 43.07).abs() < 0.01, "24,576 experts ≈ 46 GB = 43.1 GiB: {}", gib(all));
    }

    #[test]
    fn a_gguf_header_gives_the_expert_and_dense_bytes() {
        // The workspace root's testdata/, beside this crate.
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/reference/tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf");
        let g = GgufFile::open(&p)
            .unwrap_or_else(|e| panic!("{e} (./setup.sh --test or scripts/make-testdata.sh generates it)"));
        let m = ModelShape::from_gguf(&g, "tiny", 2.0).unwrap();
        assert_eq!((m.n_layers, m.n_moe_layers, m.n_expert, m.k), (2, 2, 8, 2));
        // The stored bytes, counted through the data slices rather than the type arithmetic.
        let stored = |f: &dyn Fn(&str) -> bool| {
            g.tensors().iter().filter(|t| f(&t.name)).map(|t| g.tensor_data(t).len() as u64).sum::<u64>()
        };
        assert_eq!(m.expert_bytes * 8 * 2, stored(&|n| n.contains("_exps.")));
        assert_eq!(m.resident_bytes, stored(&|n| !n.contains("_exps.")));
        assert_eq!(m.resident_bytes - m.dense_bytes, stored(&|n| n == "token_embd.weight"));
    }

    #[test]
    fn slots_fill_what_is_left_and_the_layer_time_is_the_slower_side() {
        let m = ModelShape::qwen4exp_iq3xxs(6.5625, 1.0);
        let mc = card();
        let n = slots(&m, &mc, 4096, 1 << 30, 512 << 20);
        // Left for experts: 24 GiB - resident - KV - 1.5 GiB, in slots of 48 experts.
        let left = (24u64 << 30) - m.resident_bytes - m.kv_bytes_per_pos * 4096 - (1 << 30) - (512 << 20);
        assert_eq!(n as u64, left / (m.expert_bytes * 48));
        // Every expert a hit: no CPU time, no handoff; the GPU reads dense + k experts a layer.
        let p = project(&m, &mc, 4096, 1 << 30, 512 << 20, 512, 1.0);
        assert_eq!((p.cpu_ms, p.handoff_ms), (0.0, 0.0));
        let gpu_bytes = m.dense_bytes as f64
            + (48 * 10) as f64 * m.expert_bytes as f64
            + (m.kv_bytes_per_pos * 2048 + m.state_bytes_per_token) as f64;
        assert!((p.token_ms - gpu_bytes / (960e9 * 0.5) * 1e3).abs() < 1e-6, "{p:?}");
        // Every expert a miss: the CPU side (15 x 8 = 120 GB/s capped at 60) bounds each layer.
        let p = project(&m, &mc, 4096, 1 << 30, 512 << 20, 0, 0.0);
        let cpu = 48.0 * 10.0 * m.expert_bytes as f64 / 60e9 * 1e3;
        assert!((p.cpu_ms - cpu).abs() < 1e-9 && p.token_ms > cpu, "{p:?}");
    }

    #[test]
    fn misses_sent_over_pcie_move_from_the_cpu_to_the_gpu_side() {
        let m = ModelShape::qwen4exp_iq3xxs(6.5625, 1.0);
        let missed = 48.0 * 10.0 * m.expert_bytes as f64 * 0.4; // bytes a token, at 60% hits
        let at = |frac: f64| project(&m, &Machine { pcie_frac: frac, ..card() }, 4096, 1 << 30, 512 << 20, 100, 0.6);
        let (none, half, all) = (at(0.0), at(0.5), at(1.0));
        assert_eq!(none.pcie_ms, 0.0);
        assert!((none.cpu_ms - missed / 60e9 * 1e3).abs() < 1e-9, "{none:?}");
        assert!(
            (half.cpu_ms - none.cpu_ms / 2.0).abs() < 1e-9 && (half.pcie_ms - missed / 2.0 / 25e9 * 1e3).abs() < 1e-9,
            "{half:?}"
        );
        assert_eq!(all.cpu_ms, 0.0);
        // Over a 25 GB/s link, an expert costs more than on a 60 GB/s CPU pool: F = 0 wins here.
        assert!(
            none.tokens_per_s > half.tokens_per_s && half.tokens_per_s > all.tokens_per_s,
            "{none:?} {half:?} {all:?}"
        );
    }
}
