//! Race mode: the waves of a workgroup run in a seeded random interleaving, and every LDS and
//! global access is checked against the accesses of the *other* waves of the workgroup since
//! the last barrier. Two accesses to the same byte from different waves with no `s_barrier`
//! between them, at least one of them a write, are a data race: the launch fails with
//! [`EmuError::DataRace`] naming both (wave, lane, pc, instruction), the address and its space.
//! Atomics do not race with atomics (they are serialised), but do with plain reads and writes.
//!
//! The executor calls the hooks through the [`Hooks`] trait; the default mode passes
//! [`NoHooks`], whose methods are empty and whose `RACE` constant removes every call at compile
//! time, so race mode costs nothing when it is off.
use super::Ctx;
use crate::error::{DataRace, EmuError, RaceAccess};
use rng::SplitMix64;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Name of the environment variable that turns race mode on for every [`crate::Device`] created
/// afterwards: `STRATA_EMU_RACE_SEED=<u64>` (decimal or `0x` hex).
pub const RACE_SEED_ENV: &str = "STRATA_EMU_RACE_SEED";

/// The one place the variable is parsed: `Ok(None)` when unset or empty.
pub fn race_seed_from_env() -> Result<Option<u64>, String> {
    match std::env::var(RACE_SEED_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{RACE_SEED_ENV}: {e}")),
        Ok(v) => parse_seed(&v).map_err(|e| format!("{RACE_SEED_ENV}={v:?}: {e}")),
    }
}

fn parse_seed(v: &str) -> Result<Option<u64>, String> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse::<u64>(),
    };
    r.map(Some).map_err(|e| format!("not a u64 seed ({e})"))
}

/// Memory space of a checked access.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Space {
    Lds,
    Global,
}

/// What an access does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Read,
    Write,
    Atomic,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Atomic => "atomic",
        }
    }
}

/// Executor hooks: instruction slicing and memory-access checks.
pub trait Hooks {
    /// False for [`NoHooks`]: every hook call is behind `if H::RACE`.
    const RACE: bool;
    /// Called before each instruction: true when the wave must yield (its slice is used up).
    fn tick(&mut self) -> bool;
    /// One lane's access of `n` bytes at `addr`.
    #[allow(clippy::too_many_arguments)]
    fn access(
        &mut self,
        ctx: &Ctx,
        space: Space,
        addr: u64,
        n: usize,
        kind: Kind,
        pc: u64,
        lane: u32,
    ) -> Result<(), EmuError>;
}

/// The default mode: no slicing, no checks.
pub struct NoHooks;
impl Hooks for NoHooks {
    const RACE: bool = false;
    #[inline(always)]
    fn tick(&mut self) -> bool {
        false
    }
    #[inline(always)]
    fn access(&mut self, _: &Ctx, _: Space, _: u64, _: usize, _: Kind, _: u64, _: u32) -> Result<(), EmuError> {
        Ok(())
    }
}

/// One recorded access: wave of the workgroup, lane, pc relative to the code object.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    wave: u16,
    lane: u8,
    pc: u32,
}
impl Slot {
    const NONE: Slot = Slot { wave: u16::MAX, lane: 0, pc: 0 };
    fn some(self) -> bool {
        self.wave != u16::MAX
    }
}

/// Shadow of one byte: the epoch it belongs to (older means "no access since the last
/// barrier"), its last plain writer, and up to two plain readers and two atomic accessors, the
/// second slot always from another wave than the first. That is enough to find a conflict
/// with any other wave: the launch stops at the first race, so all plain writes of an epoch
/// come from one wave.
#[derive(Clone, Copy)]
struct Cell {
    epoch: u32,
    w: Slot,
    r: [Slot; 2],
    a: [Slot; 2],
}
impl Cell {
    const EMPTY: Cell = Cell { epoch: 0, w: Slot::NONE, r: [Slot::NONE; 2], a: [Slot::NONE; 2] };
}

/// Cheap multiplicative hasher for byte addresses.
#[derive(Default)]
struct AddrHasher(u64);
impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Race-mode state of one host thread, reused by the workgroups it runs.
pub struct RaceState {
    pub seed: u64,
    pub workgroup: [u32; 3],
    /// Index of the running wave in its workgroup.
    pub wave: u16,
    /// Instructions the running wave may still execute before it yields.
    pub slice: u64,
    /// The scheduler's random numbers (deterministic per seed and workgroup).
    pub rng: SplitMix64,
    epoch: u32,
    lds: Vec<Cell>,
    global: HashMap<u64, Cell, BuildHasherDefault<AddrHasher>>,
}

impl RaceState {
    pub fn new(seed: u64) -> RaceState {
        RaceState {
            seed,
            workgroup: [0; 3],
            wave: 0,
            slice: 0,
            rng: SplitMix64::new(seed),
            epoch: 0,
            lds: Vec::new(),
            global: HashMap::default(),
        }
    }
    /// A new workgroup: its own random stream (so results do not depend on which host thread
    /// ran which workgroup), no accesses recorded.
    pub fn start_workgroup(&mut self, gid: [u32; 3], lds_bytes: usize) {
        self.workgroup = gid;
        let mix = (gid[0] as u64) | (gid[1] as u64) << 21 | (gid[2] as u64) << 42;
        self.rng = SplitMix64::new(self.seed ^ mix.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        if self.lds.len() < lds_bytes {
            self.lds.resize(lds_bytes, Cell::EMPTY);
        }
        self.barrier();
    }
    /// Every live wave passed a barrier: accesses before it are ordered before all after it.
    pub fn barrier(&mut self) {
        if self.epoch == u32::MAX {
            self.lds.fill(Cell::EMPTY);
            self.epoch = 0;
        }
        self.epoch += 1;
        self.global.clear();
    }
    /// The next slice length: mostly short (1-16 instructions), sometimes long (up to 256), so
    /// both fine-grained and coarse interleavings occur.
    pub fn pick_slice(&mut self) -> u64 {
        if self.rng.below_u64(4) == 0 { 1 + self.rng.below_u64(256) } else { 1 + self.rng.below_u64(16) }
    }

    #[allow(clippy::too_many_arguments)]
    fn conflict(
        &self,
        ctx: &Ctx,
        space: Space,
        addr: u64,
        first: Slot,
        first_kind: Kind,
        kind: Kind,
        pc: u64,
        lane: u32,
    ) -> EmuError {
        let access = |wave: u32, lane: u32, pc: u64, kind: Kind| {
            let inst = ctx
                .prog
                .insts
                .get((pc / 4) as usize)
                .filter(|i| i.fam != crate::decode::Fam::Invalid)
                .map(|i| crate::disasm::text(i, pc))
                .unwrap_or_default();
            RaceAccess { wave, lane, pc, kind: kind.name(), inst }
        };
        EmuError::DataRace(Box::new(DataRace {
            kernel: ctx.kernel.into(),
            space: if space == Space::Lds { "LDS" } else { "global" },
            addr,
            workgroup: self.workgroup,
            seed: self.seed,
            first: access(first.wave as u32, first.lane as u32, first.pc as u64, first_kind),
            second: access(self.wave as u32, lane, pc, kind),
        }))
    }
}

impl Hooks for RaceState {
    const RACE: bool = true;
    #[inline]
    fn tick(&mut self) -> bool {
        if self.slice == 0 {
            return true;
        }
        self.slice -= 1;
        false
    }
    fn access(
        &mut self,
        ctx: &Ctx,
        space: Space,
        addr: u64,
        n: usize,
        kind: Kind,
        pc: u64,
        lane: u32,
    ) -> Result<(), EmuError> {
        let rel = pc.wrapping_sub(ctx.prog.base) as u32;
        let me = Slot { wave: self.wave, lane: lane as u8, pc: rel };
        let (epoch, wave) = (self.epoch, self.wave);
        for k in 0..n as u64 {
            let b = addr + k;
            let cell = match space {
                // (bounds were checked by the caller)
                Space::Lds => match self.lds.get_mut(b as usize) {
                    Some(c) => c,
                    None => continue,
                },
                Space::Global => self.global.entry(b).or_insert(Cell::EMPTY),
            };
            if cell.epoch != epoch {
                *cell = Cell { epoch, ..Cell::EMPTY };
            }
            let other = |s: &[Slot; 2]| {
                if s[0].some() && s[0].wave != wave {
                    Some(s[0])
                } else if s[1].some() && s[1].wave != wave {
                    Some(s[1])
                } else {
                    None
                }
            };
            let found = match kind {
                Kind::Read => (cell.w.some() && cell.w.wave != wave)
                    .then_some((cell.w, Kind::Write))
                    .or(other(&cell.a).map(|s| (s, Kind::Atomic))),
                Kind::Write => (cell.w.some() && cell.w.wave != wave)
                    .then_some((cell.w, Kind::Write))
                    .or(other(&cell.r).map(|s| (s, Kind::Read)))
                    .or(other(&cell.a).map(|s| (s, Kind::Atomic))),
                Kind::Atomic => (cell.w.some() && cell.w.wave != wave)
                    .then_some((cell.w, Kind::Write))
                    .or(other(&cell.r).map(|s| (s, Kind::Read))),
            };
            if let Some((first, fk)) = found {
                return Err(self.conflict(ctx, space, b, first, fk, kind, rel as u64, lane));
            }
            let record = |s: &mut [Slot; 2]| {
                if !s[0].some() {
                    s[0] = me;
                } else if s[0].wave != wave && !s[1].some() {
                    s[1] = me;
                }
            };
            match kind {
                Kind::Read => record(&mut cell.r),
                Kind::Write => cell.w = me,
                Kind::Atomic => record(&mut cell.a),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse_seed;
    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seed(""), Ok(None));
        assert_eq!(parse_seed(" 42 "), Ok(Some(42)));
        assert_eq!(parse_seed("0x2a"), Ok(Some(42)));
        assert!(parse_seed("forty-two").is_err());
        assert!(parse_seed("-1").is_err());
    }
}
