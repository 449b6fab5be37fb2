//! The one device enum: where the forward pass runs (`--device`), read by the configuration,
//! the engine and the GPU backend alike (so none of them imports another for it).

/// Where the forward pass runs (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// A usable AMD gfx11 GPU through HIP when one is present, otherwise the CPU (saying why
    /// when a ROCm runtime was found but could not be used).
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// An AMD gfx11 GPU through ROCm's HIP runtime (loaded at run time); an error if none.
    Hip,
    /// The software RDNA3 device running the same gfx1100 kernels (slow: tests, debugging,
    /// instruction and byte counts).
    Emu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Hip => "hip",
            Device::Emu => "emu",
        }
    }
}
