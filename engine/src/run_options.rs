//! The engine's typed configuration ([`RunOptions`]): what the validated command line (or a
//! config file) says sessions and placement run with.

use gpu_executor::Device;
use model::KvType;
use model::loaded::Numerics;
use model::qwen4exp::PleOptions;

/// How sessions are built (from the validated CLI config).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Backend of the shared-decoder models (Flash-Next runs on the CPU).
    pub device: Device,
    /// Ordered-numerics mode on both backends (`--ordered`, alias `--ordered-attention`): the
    /// CPU session runs `Session::ordered` (ordered attention, the `quant` crate's scalar
    /// matmul, fmath activations) and the GPU `GpuOptions::ordered`, so `--device cpu` and
    /// `--device emu|hip` compute whole layers and logits bit for bit alike.
    pub ordered_attention: bool,
    /// `--cpu-gemm tiles`: the CPU executor's prompt products through exact-block row tiles
    /// (`Numerics::Tiles`; GPU backends ignore it).
    pub cpu_tiles: bool,
    pub kv: KvType,
    /// KV capacity in positions (0: the model's training context).
    pub max_context: usize,
    /// Tokens per prefill chunk.
    pub prefill: usize,
    /// PLE table options (Flash-Next models only).
    pub ple: PleOptions,
    /// hipBLASLt calibration table for the GPU backends (`--calibration`); None: the default
    /// location for the device (`gpu::calibrate::default_path`) when such a file exists.
    pub calibration: Option<std::path::PathBuf>,
    /// STRP profile that fills the GPU expert cache at start (`--expert-profile`).
    pub expert_profile: Option<std::path::PathBuf>,
    /// Where `generate` writes this run's routing counts (`--expert-profile-save`).
    pub expert_profile_save: Option<std::path::PathBuf>,
    /// GPU backend settings (`--gpu-*` flags / `STRATA_GPU_*`); `ordered` is set from
    /// `ordered_attention` at load.
    pub gpu: gpu_executor::options::GpuOptions,
    /// `--mmap`: leave every weight memory-mapped (as llama.cpp does by default) instead of
    /// reading the ones the CPU computes with into RAM at load ([`crate::residency`]).
    pub mmap: bool,
    /// `--mmap-experts`: the same for the routed experts only.
    pub mmap_experts: bool,
    /// Speculative decoding (`--spec N --spec-min-p P`; None: off) and its MTP head (`--mtp`;
    /// None: the suffix drafter).
    pub spec: Option<crate::spec::SpecConfig>,
    pub mtp: Option<std::path::PathBuf>,
}

impl RunOptions {
    /// The numerics mode of these options' sessions.
    pub fn numerics(&self) -> Numerics {
        Numerics::of(self.ordered_attention, self.cpu_tiles)
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: Device::Cpu,
            ordered_attention: false,
            cpu_tiles: false,
            kv: KvType::F16,
            max_context: 4096,
            prefill: 512,
            ple: PleOptions::default(),
            calibration: None,
            expert_profile: None,
            expert_profile_save: None,
            gpu: Default::default(),
            mmap: false,
            mmap_experts: false,
            spec: None,
            mtp: None,
        }
    }
}
