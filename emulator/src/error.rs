//! The one error type of the software device. Every variant names what failed (file offset,
//! kernel, PC, instruction, lane, address) so a failing test explains itself.
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum EmuError {
    /// The code object is not a well-formed ELF64 AMDGPU shared object.
    #[error("bad code object: {0}")]
    BadElf(String),
    /// A valid AMDGPU ELF for a GPU other than gfx11.
    #[error("code object is not for gfx11 (e_machine {machine}, EF_AMDGPU_MACH {mach:#x})")]
    NotGfx11 { machine: u16, mach: u32 },
    /// The NT_AMDGPU_METADATA note is missing or malformed.
    #[error("code object metadata: {0}")]
    Metadata(String),
    /// A kernel descriptor is missing, out of range, or asks for something unsupported.
    #[error("kernel descriptor of {kernel}: {what}")]
    Descriptor { kernel: String, what: String },
    #[error("kernel {0:?} is not in this module")]
    NoSuchKernel(String),
    /// A wave reached an instruction the device decodes but does not execute (MUBUF, MTBUF,
    /// MIMG, EXP, VINTERP, LDSDIR, a few exotic opcodes): `what` starts with its text.
    #[error("kernel {kernel}: unsupported instruction at pc {pc:#x}: {what}")]
    Unsupported { kernel: String, pc: u64, what: String },
    /// Words that are no gfx11 instruction (a reserved opcode or operand code): refused by the
    /// loader for every reachable instruction and when reached through a computed jump (the
    /// disassembler lists them as `.long`, like llvm-objdump). `pc` is the code-object address
    /// (as llvm-objdump prints it); `words` the instruction's dwords.
    #[error("kernel {kernel}: unknown instruction encoding at pc {pc:#x} ({}): {what}", hex_words(.words))]
    UnknownEncoding { kernel: String, pc: u64, words: Vec<u32>, what: String },
    /// Race mode (`LaunchOptions::race_seed`, `STRATA_EMU_RACE_SEED`): two waves of one
    /// workgroup accessed the same byte with no `s_barrier` between the accesses (see [`DataRace`]).
    #[error("{0}")]
    DataRace(Box<DataRace>),
    /// A global/flat/LDS/scratch access outside every allocation.
    #[error(
        "kernel {kernel}: memory fault at pc {pc:#x} `{inst}` lane {lane}: {what} address {addr:#x} ({bytes} bytes)"
    )]
    MemoryFault { kernel: String, pc: u64, inst: String, lane: u32, addr: u64, bytes: u32, what: &'static str },
    #[error("kernel {kernel} trapped at pc {pc:#x} (s_trap {code})")]
    Trap { kernel: String, pc: u64, code: u16 },
    #[error("kernel {kernel} panicked (loop): branch to itself at pc {pc:#x}")]
    PanicLoop { kernel: String, pc: u64 },
    #[error("kernel {kernel} did not terminate within {budget} instructions per wave (pc {pc:#x})")]
    Budget { kernel: String, pc: u64, budget: u64 },
    /// A barrier that can never complete (waves of one workgroup disagree).
    #[error("kernel {kernel}: barrier deadlock at pc {pc:#x}")]
    Deadlock { kernel: String, pc: u64 },
    #[error("kernel {kernel}: pc {pc:#x} is outside the decoded program")]
    BadPc { kernel: String, pc: u64 },
    /// Host-side API misuse: unknown pointer, copy out of range, bad launch geometry.
    #[error("{0}")]
    Api(String),
    #[error("allocation of {bytes} bytes refused: {reason}")]
    Alloc { bytes: usize, reason: String },
}

fn hex_words(w: &[u32]) -> String {
    w.iter().map(|x| format!("{x:08X}")).collect::<Vec<_>>().join(" ")
}

/// A data race found in race mode: two accesses to one byte from different waves of a
/// workgroup with no `s_barrier` between them, at least one a write (atomics race only with
/// plain accesses). `addr` is the LDS offset or the global address; PCs are code-object
/// addresses, as llvm-objdump prints them; `first` is the earlier access.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "kernel {kernel}: data race on {space} address {addr:#x} in workgroup {workgroup:?} (race seed {seed}): {first} and {second}, with no s_barrier between them"
)]
pub struct DataRace {
    pub kernel: String,
    /// "LDS" or "global".
    pub space: &'static str,
    pub addr: u64,
    pub workgroup: [u32; 3],
    pub seed: u64,
    pub first: RaceAccess,
    pub second: RaceAccess,
}

/// One side of a [`DataRace`]: which wave and lane of the workgroup, the instruction's
/// code-object address and text, and whether it read, wrote or did an atomic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceAccess {
    pub wave: u32,
    pub lane: u32,
    pub pc: u64,
    pub kind: &'static str,
    pub inst: String,
}

impl std::fmt::Display for RaceAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wave {} lane {} {} at pc {:#x} `{}`", self.wave, self.lane, self.kind, self.pc, self.inst)
    }
}
