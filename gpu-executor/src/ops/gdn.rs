//! Launchers of the Gated DeltaNet kernels (gpu-kernels/src/ops/gdn.rs): the token mixer of
//! Flash-Next's recurrent layers between its projections, equal to
//! `model::qwen4exp::gdn::Gdn::mix` in the order of every sum, with `quant::fmath`'s exp,
//! softplus and sigmoid instead of libm (a few ulp; tests/gpu/gpu_ops_gdn.rs names the tolerance).
use super::{GpuOps, bad, groups};
use crate::abi;
use crate::device::{DevicePtr, Result, Stream};

/// Where one sequence's GDN state lives on the device: conv `[(K-1)][C]` and delta rule
/// `[Hv][S][S]` f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDeviceState {
    pub conv: DevicePtr,
    pub delta: DevicePtr,
}

/// Which delta-rule kernel a GDN launch runs.
#[derive(Clone, Copy, PartialEq)]
enum DeltaForm {
    /// Token by token, the state in registers at head dim 128.
    Fast,
    /// Token by token, every sum in the CPU's order.
    InOrder,
    /// Chunks of up to `.0` tokens with a scratch of `2 · Hv · chunk · S` f32.
    Chunked(u32, DevicePtr),
}

/// Dimensions of one GDN layer (`ssm.*` of the GGUF).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnShape {
    /// Key heads Hk.
    pub hk: u32,
    /// Value heads Hv (a multiple of Hk is not required: value head h reads key head h mod Hk).
    pub hv: u32,
    /// Head dim S (state S x S per value head).
    pub head_dim: u32,
    /// Conv width K (>= 1).
    pub conv_k: u32,
    pub eps: f32,
}

impl GdnShape {
    /// Conv channels C = 2 Hk S + Hv S.
    pub fn channels(&self) -> u32 {
        (2 * self.hk + self.hv) * self.head_dim
    }
    /// f32 of one sequence's conv state `[(K-1)][C]`.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_k as usize - 1) * self.channels() as usize
    }
    /// f32 of one sequence's delta-rule state `[Hv][S][S]`.
    pub fn delta_state_len(&self) -> usize {
        (self.hv * self.head_dim * self.head_dim) as usize
    }
    fn check(&self) -> Result<()> {
        let name = "gdn";
        if self.hk == 0 || self.hv == 0 || self.head_dim == 0 || self.conv_k == 0 {
            return Err(bad(name, format!("{self:?}: every dimension must be at least 1")));
        }
        // Every index of the kernels is u32.
        let state = self.hv as u64 * self.head_dim as u64 * self.head_dim as u64;
        if state > u32::MAX as u64 || self.channels() as u64 * abi::GDN_MAX_TOKENS as u64 > u32::MAX as u64 {
            return Err(bad(name, format!("{self:?}: state or conv rows exceed 32-bit indexing")));
        }
        Ok(())
    }
}

/// Device buffers of one [`GpuOps::gdn_mix`] call (f32, row-major).
#[derive(Clone, Copy, Debug)]
pub struct GdnBuffers {
    /// Conv inputs `[n][C]` (the qkv projection); overwritten.
    pub m: DevicePtr,
    /// Gate `[n][Hv S]`.
    pub z: DevicePtr,
    /// β and α logits `[n][Hv]`.
    pub beta: DevicePtr,
    pub alpha: DevicePtr,
    /// Layer constants: conv taps `[C][K]`, dt bias and ssm_a `[Hv]`, norm gamma `[S]`.
    pub taps: DevicePtr,
    pub dt_bias: DevicePtr,
    pub ssm_a: DevicePtr,
    pub norm: DevicePtr,
    /// The sequence's state: conv `[(K-1)][C]` and delta rule `[Hv][S][S]`, advanced in place.
    pub conv_state: DevicePtr,
    pub delta_state: DevicePtr,
    /// Scratch `[n][C]` (conv output), then the result `o [n][Hv S]`.
    pub u: DevicePtr,
    pub o: DevicePtr,
    /// Also `o`'s Q8_1 rows here, for the output product (0: none; S a multiple of 32).
    pub o_q8_1: DevicePtr,
}

impl GpuOps {
    /// Copies a sequence's GDN state `from` → `to` on `s` (a snapshot before a speculative
    /// window, and the restore when drafts are rejected): the recurrence has no cache to
    /// truncate, so rollback is a copy back.
    pub fn gdn_state_copy(&self, s: &Stream, shape: &GdnShape, from: GdnDeviceState, to: GdnDeviceState) -> Result<()> {
        shape.check()?;
        let api = self.api();
        if shape.conv_k > 1 {
            api.memcpy_dtod_async(s, to.conv, from.conv, shape.conv_state_len() * 4)?;
        }
        api.memcpy_dtod_async(s, to.delta, from.delta, shape.delta_state_len() * 4)
    }

    /// The GDN token mixer for `n_tokens` (1..=`abi::GDN_MAX_TOKENS`) of one sequence: conv +
    /// SiLU, q/k L2 norms, the delta rule token by token, the gated RMS norm; `o` is the input
    /// of the output projection. Four launches on `s`.
    pub fn gdn_mix(&self, s: &Stream, shape: &GdnShape, b: &GdnBuffers, n_tokens: u32) -> Result<()> {
        shape.check()?;
        if n_tokens == 0 || n_tokens > abi::GDN_MAX_TOKENS {
            return Err(bad("gdn", format!("{n_tokens} tokens, the kernels take 1..={}", abi::GDN_MAX_TOKENS)));
        }
        self.gdn_launch(s, shape, b, n_tokens, DeltaForm::Fast)
    }

    /// [`GpuOps::gdn_mix`] with every sum in the CPU's order (`Gdn::mix`, token by token): the
    /// generic delta-rule kernel at every head dim (the register form for head dim 128 adds
    /// two halves of each sum). What the ordered mode runs; equal to the CPU's `Gdn::mix_with`
    /// (`Numerics::Ordered`) bit for bit.
    pub fn gdn_mix_in_order(&self, s: &Stream, shape: &GdnShape, b: &GdnBuffers, n_tokens: u32) -> Result<()> {
        shape.check()?;
        if n_tokens == 0 || n_tokens > abi::GDN_MAX_TOKENS {
            return Err(bad("gdn", format!("{n_tokens} tokens, the kernels take 1..={}", abi::GDN_MAX_TOKENS)));
        }
        self.gdn_launch(s, shape, b, n_tokens, DeltaForm::InOrder)
    }

    /// The GDN token mixer for a prompt chunk of `n_tokens` (1..=`abi::GDN_MAX_PREFILL_TOKENS`):
    /// as [`GpuOps::gdn_mix`] with the chunked delta rule (`Gdn::mix`'s `GdnMode::Chunked`,
    /// chunks of `chunk` tokens, 1..=`abi::GDN_CHUNK_MAX`), which reads and writes the state
    /// once a chunk. `delta` is a scratch of `2 · Hv · chunk · S` f32.
    pub fn gdn_prefill(
        &self,
        s: &Stream,
        shape: &GdnShape,
        b: &GdnBuffers,
        n_tokens: u32,
        chunk: u32,
        delta: DevicePtr,
    ) -> Result<()> {
        shape.check()?;
        if n_tokens == 0
            || n_tokens > abi::GDN_MAX_PREFILL_TOKENS
            || n_tokens as u64 * shape.channels() as u64 > u32::MAX as u64
        {
            return Err(bad(
                "gdn",
                format!(
                    "{n_tokens} prompt tokens, the chunked kernels take 1..={} (and 32-bit indexing)",
                    abi::GDN_MAX_PREFILL_TOKENS
                ),
            ));
        }
        if shape.head_dim > abi::GDN_CHUNK_MAX_HEAD_DIM {
            return Err(bad(
                "gdn",
                format!(
                    "head dim {} for the chunked delta rule (at most {})",
                    shape.head_dim,
                    abi::GDN_CHUNK_MAX_HEAD_DIM
                ),
            ));
        }
        if chunk == 0 || chunk > abi::GDN_CHUNK_MAX {
            return Err(bad("gdn", format!("chunk of {chunk} tokens, the kernel takes 1..={}", abi::GDN_CHUNK_MAX)));
        }
        self.gdn_launch(s, shape, b, n_tokens, DeltaForm::Chunked(chunk, delta))
    }

    /// Conv, norms, the delta rule (token by token, or chunked with its scratch), gated norm.
    fn gdn_launch(&self, s: &Stream, shape: &GdnShape, b: &GdnBuffers, n_tokens: u32, form: DeltaForm) -> Result<()> {
        let c = shape.channels();
        let name = abi::GDN_CONV_SILU;
        let a = abi::GdnConvArgs {
            m: b.m,
            state: b.conv_state,
            taps: b.taps,
            u: b.u,
            n_tokens,
            channels: c,
            conv_k: shape.conv_k,
            _pad: 0,
        };
        self.launch(s, name, groups(c as u64, abi::WG_SIZE, name)?, 0, &a.to_bytes())?;

        let name = abi::GDN_L2_NORM;
        let heads = 2 * shape.hk;
        let a = abi::GdnL2NormArgs {
            x: b.u,
            n_tokens,
            n_heads: heads,
            head_dim: shape.head_dim,
            token_stride: c,
            eps_bits: shape.eps.to_bits(),
            _pad: 0,
        };
        self.launch(s, name, groups(n_tokens as u64 * heads as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())?;

        if let DeltaForm::Chunked(chunk, delta) = form {
            let name = abi::GDN_DELTA_CHUNKED;
            let a = abi::GdnChunkArgs {
                u: b.u,
                beta: b.beta,
                alpha: b.alpha,
                dt_bias: b.dt_bias,
                ssm_a: b.ssm_a,
                state: b.delta_state,
                o: b.o,
                delta,
                n_tokens,
                hk: shape.hk,
                hv: shape.hv,
                s: shape.head_dim,
                channels: c,
                chunk,
            };
            self.launch(s, name, shape.hv, abi::GDN_CHUNK_LDS_BYTES, &a.to_bytes())?;
            return self.gdn_gated_norm(s, shape, b, n_tokens);
        }
        // Flash-Next's head dim keeps the state in registers across the window.
        let (name, lds) = if shape.head_dim == 128 && form == DeltaForm::Fast {
            (abi::GDN_DELTA_RULE_S128, abi::GDN_S128_LDS_BYTES)
        } else {
            (abi::GDN_DELTA_RULE, 0)
        };
        let a = abi::GdnDeltaArgs {
            u: b.u,
            beta: b.beta,
            alpha: b.alpha,
            dt_bias: b.dt_bias,
            ssm_a: b.ssm_a,
            state: b.delta_state,
            o: b.o,
            n_tokens,
            hk: shape.hk,
            hv: shape.hv,
            s: shape.head_dim,
            channels: c,
            _pad: 0,
        };
        self.launch(s, name, shape.hv, lds, &a.to_bytes())?;
        self.gdn_gated_norm(s, shape, b, n_tokens)
    }

    /// `o ← rms(o; norm) ⊙ σ(z)` per head.
    fn gdn_gated_norm(&self, s: &Stream, shape: &GdnShape, b: &GdnBuffers, n_tokens: u32) -> Result<()> {
        let name = abi::GDN_GATED_NORM;
        if b.o_q8_1 != 0 && !shape.head_dim.is_multiple_of(32) {
            return Err(bad(name, format!("Q8_1 output of heads of {} (not a multiple of 32)", shape.head_dim)));
        }
        let rows = n_tokens * shape.hv;
        let a = abi::GdnGatedNormArgs {
            o: b.o,
            z: b.z,
            w: b.norm,
            q: b.o_q8_1,
            n_rows: rows,
            n: shape.head_dim,
            eps_bits: shape.eps.to_bits(),
            _pad: 0,
        };
        self.launch(s, name, groups(rows as u64, abi::WAVES_PER_WG, name)?, 0, &a.to_bytes())
    }
}
