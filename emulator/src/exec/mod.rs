//! Executor: runs the waves of one workgroup over the pre-decoded program.
//!
//! A wave is 32 lanes; vector registers are `[u32; 32]` rows so per-instruction lane loops
//! are tight and vectorisable. Waves of a workgroup are run one after another until each
//! reaches `s_barrier` (or ends); then all are released. This interleaving makes a missing
//! barrier visible as wrong results, the way a real GPU would (eventually) show it. Race mode
//! ([`race`]) instead interleaves the waves at random and checks their memory accesses.
mod dpp;
mod mem;
mod packed;
pub mod race;
mod scalar;
mod valu;
mod vcmp;
mod wmma;

use crate::decode::{Fam, Inst, src};
use crate::error::EmuError;
use crate::memory::{self, View};
use std::sync::Arc;

/// Where the decoded program lives: `insts[(pc - base) / 4]`.
pub struct Program {
    pub base: u64,
    pub insts: Vec<Inst>,
    /// Kernel entry points and names.
    pub kernel_names: Vec<(u64, String)>,
    /// The raw image words, for instructions reached only through computed jumps
    /// (`s_setpc_b64` to an address the static walk did not find); decoded on the fly.
    pub words: Vec<u32>,
}

/// Everything a wave needs that is shared by the whole launch.
pub struct Ctx<'a> {
    pub prog: &'a Program,
    pub kernel: &'a str,
    pub regions: &'a [Arc<memory::Region>],
    pub mem: &'a memory::Memory,
    pub budget: u64,
    /// f32 denormals kept (mode 3) or flushed (0).
    pub f32_denorm: bool,
    pub f16_denorm: bool,
    /// RSRC1 IEEE mode (min/max NaN rules).
    pub ieee: bool,
    pub private_size: u32,
}

/// Per-wave counters, merged into `LaunchStats`.
#[derive(Default, Clone)]
pub struct Counters {
    pub by_fam: [u64; 21],
    pub lane_ops: u64,
    pub global_read: u64,
    pub global_written: u64,
    pub lds_bytes: u64,
}

pub struct Wave {
    /// Scalar register file: s0-s105, VCC 106/107, TTMP, NULL 124, M0 125, EXEC 126/127.
    pub s: [u32; 128],
    pub scc: bool,
    pub v: Vec<[u32; 32]>,
    pub pc: u64,
    pub done: bool,
    pub at_barrier: bool,
    pub executed: u64,
    /// Per-lane scratch (private segment), `private_size` bytes per lane.
    pub scratch: Vec<u8>,
    pub f32_denorm: bool,
    pub f16_denorm: bool,
    pub ieee: bool,
}

/// Why `run` returned: the wave waits at a barrier, ended, or (race mode) used up its slice.
#[derive(PartialEq, Eq, Debug)]
pub enum Stop {
    Barrier,
    End,
    Slice,
}

pub const NUM_VGPRS: usize = 256;
/// Extra rows after v255 so multi-dword operands starting near the end of the file (only in
/// malformed code) cannot index out of bounds.
pub const VGPR_PAD: usize = 16;

impl Wave {
    pub fn new(ctx: &Ctx) -> Wave {
        Wave {
            s: [0; 128],
            scc: false,
            v: vec![[0; 32]; NUM_VGPRS + VGPR_PAD],
            pc: 0,
            done: false,
            at_barrier: false,
            executed: 0,
            scratch: vec![0; ctx.private_size as usize * 32],
            f32_denorm: ctx.f32_denorm,
            f16_denorm: ctx.f16_denorm,
            ieee: ctx.ieee,
        }
    }
    /// Fresh scalar state for reuse by another workgroup (VGPRs keep stale values, as on hardware;
    /// scratch is cleared because its size may differ between launches).
    pub fn reset(&mut self, ctx: &Ctx) {
        self.s = [0; 128];
        self.scc = false;
        self.done = false;
        self.at_barrier = false;
        self.executed = 0;
        self.scratch.clear();
        self.scratch.resize(ctx.private_size as usize * 32, 0);
        self.f32_denorm = ctx.f32_denorm;
        self.f16_denorm = ctx.f16_denorm;
        self.ieee = ctx.ieee;
        for row in self.v.iter_mut().take(1) {
            *row = [0; 32];
        }
    }
    #[inline(always)]
    pub fn exec(&self) -> u32 {
        self.s[src::EXEC_LO as usize]
    }
    #[inline(always)]
    pub fn vcc(&self) -> u32 {
        self.s[src::VCC_LO as usize]
    }

    /// 32-bit value of a scalar operand code (SGPR, inline constant, literal, special).
    #[inline]
    pub fn sval(&self, code: u16, lit: u32) -> u32 {
        match code {
            0..=105 | 106..=123 | 125..=127 => self.s[code as usize],
            124 => 0,
            128..=192 => (code - 128) as u32,
            193..=208 => (-((code - 192) as i32)) as u32,
            240 => 0.5f32.to_bits(),
            241 => (-0.5f32).to_bits(),
            242 => 1.0f32.to_bits(),
            243 => (-1.0f32).to_bits(),
            244 => 2.0f32.to_bits(),
            245 => (-2.0f32).to_bits(),
            246 => 4.0f32.to_bits(),
            247 => (-4.0f32).to_bits(),
            248 => 0x3e22f983, // 1/(2*pi)
            src::SHARED_BASE => (memory::SHARED_BASE >> 32) as u32,
            src::SHARED_LIMIT => ((memory::SHARED_BASE + memory::APERTURE_SIZE - 1) >> 32) as u32,
            src::PRIVATE_BASE => (memory::PRIVATE_BASE >> 32) as u32,
            src::PRIVATE_LIMIT => ((memory::PRIVATE_BASE + memory::APERTURE_SIZE - 1) >> 32) as u32,
            src::VCCZ => (self.vcc() == 0) as u32,
            src::EXECZ => (self.exec() == 0) as u32,
            src::SCC => self.scc as u32,
            src::LITERAL => lit,
            _ => 0,
        }
    }
    /// 16-bit view of a scalar operand: inline float constants become f16.
    #[inline]
    pub fn sval16(&self, code: u16, lit: u32) -> u32 {
        match code {
            240 => 0x3800,
            241 => 0xb800,
            242 => 0x3c00,
            243 => 0xbc00,
            244 => 0x4000,
            245 => 0xc000,
            246 => 0x4400,
            247 => 0xc400,
            248 => 0x3118,
            _ => self.sval(code, lit),
        }
    }
    /// 64-bit value of a scalar operand (register pairs, 64-bit inline constants).
    #[inline]
    pub fn sval64(&self, code: u16, lit: u32, float: bool) -> u64 {
        match code {
            0..=123 | 125..=127 => self.s[code as usize] as u64 | (self.s[(code as usize + 1) & 127] as u64) << 32,
            124 => 0,
            128..=192 => (code - 128) as u64,
            193..=208 => (-((code - 192) as i64)) as u64,
            240..=247 => {
                let f = [0.5f64, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0][(code - 240) as usize];
                f.to_bits()
            }
            248 => 0x3fc45f306dc9c882,
            src::LITERAL => {
                if float {
                    (lit as u64) << 32
                } else {
                    lit as u64
                }
            }
            src::SHARED_BASE | src::PRIVATE_BASE | src::SHARED_LIMIT | src::PRIVATE_LIMIT => {
                (self.sval(code, lit) as u64) << 32
            }
            _ => self.sval(code, lit) as u64,
        }
    }
    #[inline]
    pub fn swrite(&mut self, code: u16, val: u32) {
        if (code as usize) < 128 && code != src::NULL {
            self.s[code as usize] = val;
        }
    }
    #[inline]
    pub fn swrite64(&mut self, code: u16, val: u64) {
        self.swrite(code, val as u32);
        self.swrite(code + 1, (val >> 32) as u32);
    }
    /// Per-lane 32-bit value of any operand.
    #[inline]
    pub fn vsrc(&self, code: u16, lit: u32) -> [u32; 32] {
        if code >= src::VGPR0 { self.v[(code - src::VGPR0) as usize] } else { [self.sval(code, lit); 32] }
    }
    /// Per-lane 64-bit operand (VGPR pair or 64-bit scalar/constant).
    #[inline]
    pub fn vsrc64(&self, code: u16, lit: u32, float: bool) -> [u64; 32] {
        let mut r = [0u64; 32];
        if code >= src::VGPR0 {
            let n = (code - src::VGPR0) as usize;
            let (lo, hi) = (&self.v[n], &self.v[(n + 1) % NUM_VGPRS]);
            for l in 0..32 {
                r[l] = lo[l] as u64 | (hi[l] as u64) << 32;
            }
        } else {
            r = [self.sval64(code, lit, float); 32];
        }
        r
    }
    /// Write a VGPR row under EXEC.
    #[inline]
    pub fn vwrite(&mut self, reg: u16, val: &[u32; 32]) {
        let exec = self.exec();
        let d = &mut self.v[reg as usize % NUM_VGPRS];
        for l in 0..32 {
            if exec >> l & 1 != 0 {
                d[l] = val[l];
            }
        }
    }
    #[inline]
    pub fn vwrite64(&mut self, reg: u16, val: &[u64; 32]) {
        let mut lo = [0u32; 32];
        let mut hi = [0u32; 32];
        for l in 0..32 {
            lo[l] = val[l] as u32;
            hi[l] = (val[l] >> 32) as u32;
        }
        self.vwrite(reg, &lo);
        self.vwrite(reg + 1, &hi);
    }
}

/// Execution error context: builds the error with kernel and PC.
pub fn unsupported(ctx: &Ctx, pc: u64, inst: &Inst, what: &str) -> EmuError {
    EmuError::Unsupported {
        kernel: ctx.kernel.to_string(),
        pc,
        what: format!("{} ({what})", crate::disasm::text(inst, pc)),
    }
}

/// Run `wave` until it ends or reaches a barrier.
pub fn run(ctx: &Ctx, w: &mut Wave, lds: &mut [u8], view: &mut View, c: &mut Counters) -> Result<Stop, EmuError> {
    run_with(ctx, w, lds, view, c, &mut race::NoHooks)
}

/// Run `wave` until it ends, reaches a barrier, or `h` ends its slice (race mode).
pub fn run_with<H: race::Hooks>(
    ctx: &Ctx,
    w: &mut Wave,
    lds: &mut [u8],
    view: &mut View,
    c: &mut Counters,
    h: &mut H,
) -> Result<Stop, EmuError> {
    let prog = ctx.prog;
    loop {
        if H::RACE && h.tick() {
            return Ok(Stop::Slice);
        }
        let pc = w.pc;
        let idx = (pc.wrapping_sub(prog.base) / 4) as usize;
        let inst = match prog.insts.get(idx) {
            Some(i) if i.fam != Fam::Invalid && pc >= prog.base && pc & 3 == 0 => *i,
            Some(_) if pc >= prog.base && pc & 3 == 0 && idx < prog.words.len() => {
                // reached only through a computed jump: decoded now, refused if unknown
                match crate::decode::decode(&prog.words[idx..]) {
                    Ok(i) => i,
                    Err(e) => {
                        let n = crate::decode::shown_words(prog.words[idx]).min(prog.words.len() - idx);
                        return Err(EmuError::UnknownEncoding {
                            kernel: ctx.kernel.into(),
                            pc: pc - prog.base,
                            words: prog.words[idx..idx + n].to_vec(),
                            what: e.0,
                        });
                    }
                }
            }
            _ => return Err(EmuError::BadPc { kernel: ctx.kernel.into(), pc }),
        };
        w.executed += 1;
        if w.executed > ctx.budget {
            return Err(EmuError::Budget { kernel: ctx.kernel.into(), pc, budget: ctx.budget });
        }
        c.by_fam[inst.fam as usize] += 1;
        w.pc = pc + inst.len as u64;
        match inst.fam {
            Fam::Sop1 | Fam::Sop2 | Fam::Sopk | Fam::Sopc => scalar::salu(ctx, w, &inst, pc)?,
            Fam::Sopp => {
                if let Some(stop) = scalar::sopp(ctx, w, &inst, pc)? {
                    return Ok(stop);
                }
            }
            Fam::Smem => scalar::smem(ctx, w, &inst, pc, view, c, h)?,
            Fam::Valu => {
                c.lane_ops += w.exec().count_ones() as u64;
                valu::exec(ctx, w, &inst, pc)?
            }
            Fam::Vopd => {
                c.lane_ops += 2 * w.exec().count_ones() as u64;
                valu::vopd(ctx, w, &inst, pc)?
            }
            Fam::Vop3p if inst.dpp_kind != crate::decode::Dpp::None => {
                return Err(unsupported(ctx, pc, &inst, "not implemented by the software device"));
            }
            Fam::Vop3p => {
                c.lane_ops += w.exec().count_ones() as u64;
                packed::exec(ctx, w, &inst, pc)?
            }
            Fam::Ds if inst.flags & 8 != 0 => {
                return Err(unsupported(ctx, pc, &inst, "GDS is not implemented by the software device"));
            }
            Fam::Ds if inst.op == 20 => {} // ds_nop
            Fam::Ds => mem::ds(ctx, w, &inst, pc, lds, c, h)?,
            Fam::Flat | Fam::Global | Fam::Scratch => mem::flat(ctx, w, &inst, pc, lds, view, c, h)?,
            Fam::Cache => {}
            // decoded (and disassembled) but not implemented by the software device
            Fam::Mubuf | Fam::Mtbuf | Fam::Mimg | Fam::Exp | Fam::Vinterp | Fam::Ldsdir => {
                return Err(unsupported(ctx, pc, &inst, "not implemented by the software device"));
            }
            Fam::Invalid => unreachable!(),
        }
    }
}

/// Lane-operations per second of the VALU path on one core (a loop of `v_fma_f32` and
/// `v_add_nc_u32` in a hand-assembled program run by the normal run loop), measured in thread
/// CPU time where the OS provides it.
pub fn bench_lane_ops_per_sec() -> f64 {
    use crate::decode::decode;
    // s_movk_i32 s4, 30000; L: 8 x v_fma_f32 v3, v0, v1, v2; v_add_nc_u32 v4, v4, v1;
    // s_sub_u32 s4, s4, 1; s_cmp_lg_u32 s4, 0; s_cbranch_scc1 L; s_endpgm
    let mut words: Vec<u32> = vec![0xB0040000 | 30000];
    for _ in 0..8 {
        words.extend([0xD6130003, (256 + 2) << 18 | (256 + 1) << 9 | 256]);
    }
    words.push(0x4a000000 | 4 << 17 | (1 << 9) | (256 + 4));
    words.extend([0x80848104, 0xBF078004]);
    let back = -((words.len() - 1 + 1) as i32) as u16;
    words.push(0xBFA20000 | back as u32);
    words.push(0xBFB00000);
    let mut insts = vec![Inst::INVALID; words.len()];
    let mut k = 0;
    while k < words.len() {
        let i = decode(&words[k..]).expect("bench program decodes");
        insts[k] = i;
        k += i.len as usize / 4;
    }
    let prog = Program { base: 0x1000, insts, kernel_names: Vec::new(), words: Vec::new() };
    let regions = Vec::new();
    let mem = memory::Memory::default();
    let ctx = Ctx {
        prog: &prog,
        kernel: "bench",
        regions: &regions,
        mem: &mem,
        budget: u64::MAX,
        f32_denorm: true,
        f16_denorm: true,
        ieee: true,
        private_size: 0,
    };
    let mut w = Wave::new(&ctx);
    w.pc = 0x1000;
    w.s[src::EXEC_LO as usize] = u32::MAX;
    for l in 0..32 {
        w.v[0][l] = (1.0f32 + l as f32).to_bits();
        w.v[1][l] = 0.5f32.to_bits();
        w.v[2][l] = 0.25f32.to_bits();
    }
    let mut c = Counters::default();
    let mut view = View::new(&regions);
    let (t, cpu0) = (std::time::Instant::now(), thread_cpu_seconds());
    let r = run(&ctx, &mut w, &mut [], &mut view, &mut c);
    assert_eq!(r, Ok(Stop::End), "bench program");
    std::hint::black_box(&w.v[3]);
    // CPU time of this thread when available: the machines are shared, and wall time would
    // measure the other tenants too.
    let secs = match (cpu0, thread_cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => t.elapsed().as_secs_f64(),
    };
    c.lane_ops as f64 / secs
}

/// CPU seconds consumed by the calling thread (Linux), or None.
fn thread_cpu_seconds() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        unsafe extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: clock_gettime only writes the timespec we pass; the layout matches the
        // 64-bit Linux `struct timespec` (two 64-bit fields).
        let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if r == 0 {
            return Some(ts.sec as f64 + ts.nsec as f64 * 1e-9);
        }
    }
    None
}
