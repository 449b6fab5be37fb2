//! Launchers of the PLE block kernels (gpu-kernels/src/ops/ple.rs): Flash-Next's n-gram block
//! after the host has gathered the window's table rows and the key / value projections ran,
//! equal to `cpu::qwen4exp::ple`'s `PleBlock::mix` in the order of every sum, with
//! `quant::fmath`'s sigmoid and SiLU (a few ulp; tests/gpu/gpu_ops_ple.rs names the tolerance).
use super::{GpuOps, bad, groups};
use crate::abi;
use crate::device::{DevicePtr, Result, Stream};

/// Dimensions of the PLE block (`ple.*` of the GGUF).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PleShape {
    /// Residual streams (`hyper_connection.count`).
    pub hc: u32,
    /// Embedding width E.
    pub e: u32,
    /// Conv taps Kp (>= 1).
    pub conv_kernel: u32,
    /// Conv dilation: the n-gram order N.
    pub dilation: u32,
    pub eps: f32,
}

impl PleShape {
    /// Channels of the conv, `hc · E`.
    pub fn channels(&self) -> u32 {
        self.hc * self.e
    }
    /// f32 of one sequence's conv history `[(Kp − 1)·N][hc·E]`.
    pub fn hist_len(&self) -> usize {
        (self.conv_kernel as usize - 1) * self.dilation as usize * self.channels() as usize
    }
    fn check(&self, n_tokens: u32) -> Result<()> {
        if self.hc == 0 || self.e == 0 || self.conv_kernel == 0 || self.dilation == 0 {
            return Err(bad("ple", format!("{self:?}: every dimension must be at least 1")));
        }
        let rows = n_tokens as u64 + (self.conv_kernel as u64 - 1) * self.dilation as u64;
        if n_tokens == 0 || rows * self.channels() as u64 > u32::MAX as u64 {
            return Err(bad("ple", format!("{n_tokens} tokens of {self:?}: empty or beyond 32-bit indexing")));
        }
        Ok(())
    }
}

/// Device buffers of one [`GpuOps::ple_block`] call (f32, row-major).
#[derive(Clone, Copy, Debug)]
pub struct PleBuffers {
    /// The key projection `[n][hc][E]` and the value projection `[n][E]` of the gathered rows.
    pub key: DevicePtr,
    pub val: DevicePtr,
    /// The residual streams `[n][hc][E]`, updated in place.
    pub r: DevicePtr,
    /// Layer constants: the key, query and conv norm gammas `[3][hc][E]` back to back, the conv
    /// taps `[hc·E][Kp]`.
    pub norms: DevicePtr,
    pub taps: DevicePtr,
    /// The sequence's conv history `[(Kp − 1)·N][hc·E]`, advanced in place.
    pub hist: DevicePtr,
    /// Scratch `[n][hc][E]` each: the gated value and its norm.
    pub gv: DevicePtr,
    pub nn: DevicePtr,
}

impl GpuOps {
    /// The PLE block for `n_tokens` of one sequence: the gate and norm (one wave per token and
    /// stream), then the conv with the residual update (one work-item per channel). Two
    /// launches on `s`.
    pub fn ple_block(&self, s: &Stream, shape: &PleShape, b: &PleBuffers, n_tokens: u32) -> Result<()> {
        shape.check(n_tokens)?;
        let name = abi::PLE_GATE;
        let rows = n_tokens * shape.hc;
        let a = abi::PleGateArgs {
            key: b.key,
            r: b.r,
            val: b.val,
            norms: b.norms,
            gv: b.gv,
            nn: b.nn,
            n_tokens,
            hc: shape.hc,
            e: shape.e,
            eps_bits: shape.eps.to_bits(),
        };
        self.launch(s, name, groups(rows as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())?;
        let name = abi::PLE_CONV;
        let a = abi::PleConvArgs {
            nn: b.nn,
            gv: b.gv,
            taps: b.taps,
            hist: b.hist,
            r: b.r,
            n_tokens,
            channels: shape.channels(),
            kp: shape.conv_kernel,
            dil: shape.dilation,
        };
        self.launch(s, name, groups(shape.channels() as u64, abi::WG_SIZE, name)?, 0, &a.to_bytes())
    }
}
