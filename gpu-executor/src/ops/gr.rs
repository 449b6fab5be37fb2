//! Launchers of the hyper-connection kernels (gpu-kernels/src/ops/gr.rs). A GR read is
//! `gr_stream_norm` → down matmul → `gr_lowrank_act` → up matmul → `gr_gate_mix` (plus the
//! injection matmul of the normalised streams); a write is `gr_combine`. Equal to
//! `model::qwen4exp::gr::HyperConn`'s steps: the norm bit for bit, the rest within
//! `GR_TOL` (`quant::fmath` sigmoid/SiLU; tests/gpu/gpu_ops_gr.rs).
use super::{GpuOps, bad, groups};
use crate::abi;
use crate::device::{DevicePtr, Result, Stream};

/// Dimensions of one hyper-connection mixer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrShape {
    /// Streams (`hyper_connection.count`).
    pub hc: u32,
    /// Embedding width E.
    pub e: u32,
    pub eps: f32,
}

impl GrShape {
    fn check(&self, n_tokens: u32) -> Result<()> {
        if self.hc == 0 || self.e == 0 {
            return Err(bad("gr", format!("{self:?}: streams and width must be at least 1")));
        }
        if n_tokens == 0 || n_tokens as u64 * self.hc as u64 * self.e as u64 > u32::MAX as u64 {
            return Err(bad(
                "gr",
                format!("{n_tokens} tokens of {} streams x {}: empty or beyond 32-bit indexing", self.hc, self.e),
            ));
        }
        Ok(())
    }
}

impl GpuOps {
    /// `flat[t][c] = rms(r[t][c]; gamma[c])` for `n_tokens` tokens of `[hc][E]` streams; with
    /// `q8_1`, also `flat`'s Q8_1 rows there (what `quantize_q8_1` would write; E a multiple of
    /// 32).
    #[allow(clippy::too_many_arguments)]
    pub fn gr_stream_norm(
        &self,
        s: &Stream,
        shape: &GrShape,
        r: DevicePtr,
        gamma: DevicePtr,
        flat: DevicePtr,
        q8_1: Option<DevicePtr>,
        n_tokens: u32,
    ) -> Result<()> {
        shape.check(n_tokens)?;
        let name = abi::GR_STREAM_NORM;
        if q8_1.is_some() && !shape.e.is_multiple_of(32) {
            return Err(bad(name, format!("Q8_1 output of rows of {} (not a multiple of 32)", shape.e)));
        }
        let rows = n_tokens * shape.hc;
        let a = abi::GrArgs {
            a: r,
            b: gamma,
            c: flat,
            q: q8_1.unwrap_or(0),
            n: rows,
            e: shape.e,
            hc: shape.hc,
            eps_bits: shape.eps.to_bits(),
        };
        self.launch(s, name, groups(rows as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())
    }

    /// `lo = silu(lo / hc)` in place, `n` values (the down projection of `n_tokens` tokens);
    /// with `q8_1 = (buffer, width)`, also `lo`'s Q8_1 rows of `width` there (what
    /// `quantize_q8_1` would write; `width` a multiple of 32 dividing `n`).
    pub fn gr_lowrank_act(
        &self,
        s: &Stream,
        shape: &GrShape,
        lo: DevicePtr,
        q8_1: Option<(DevicePtr, u32)>,
        n: u32,
    ) -> Result<()> {
        let name = abi::GR_LOWRANK_ACT;
        if let Some((_, w)) = q8_1
            && (w == 0 || !w.is_multiple_of(32) || !n.is_multiple_of(w))
        {
            return Err(bad(
                name,
                format!("Q8_1 output of rows of {w} over {n} values (rows must be a multiple of 32 wide)"),
            ));
        }
        let a = abi::GrArgs { a: lo, b: 0, c: 0, q: q8_1.map_or(0, |(p, _)| p), n, e: 0, hc: shape.hc, eps_bits: 0 };
        self.launch(s, name, groups(n as u64, abi::WG_SIZE, name)?, 0, &a.to_bytes())
    }

    /// `x[t] = (1/hc) Σ_c flat[t][c] ⊙ σ(gate[t][c])`: the block input.
    pub fn gr_gate_mix(
        &self,
        s: &Stream,
        shape: &GrShape,
        flat: DevicePtr,
        gate: DevicePtr,
        x: DevicePtr,
        n_tokens: u32,
    ) -> Result<()> {
        shape.check(n_tokens)?;
        let name = abi::GR_GATE_MIX;
        let a = abi::GrArgs { a: flat, b: gate, c: x, q: 0, n: n_tokens, e: shape.e, hc: shape.hc, eps_bits: 0 };
        self.launch(s, name, groups(n_tokens as u64 * shape.e as u64, abi::WG_SIZE, name)?, 0, &a.to_bytes())
    }

    /// `r[t][c] += 2 σ(inj[t][c] / hc) · y[t]`: the block output into every stream.
    pub fn gr_combine(
        &self,
        s: &Stream,
        shape: &GrShape,
        r: DevicePtr,
        y: DevicePtr,
        inj: DevicePtr,
        n_tokens: u32,
    ) -> Result<()> {
        shape.check(n_tokens)?;
        let name = abi::GR_COMBINE;
        let a = abi::GrArgs { a: r, b: y, c: inj, q: 0, n: n_tokens, e: shape.e, hc: shape.hc, eps_bits: 0 };
        self.launch(
            s,
            name,
            groups(n_tokens as u64 * shape.hc as u64 * shape.e as u64, abi::WG_SIZE, name)?,
            0,
            &a.to_bytes(),
        )
    }
}
