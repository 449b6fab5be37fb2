//! Vector memory: DS (LDS, including ds_swizzle/ds_permute/ds_bpermute) and
//! FLAT/GLOBAL/SCRATCH loads, stores and atomics. Every lane's access is bounds-checked
//! (allocation, LDS size, private segment size) and a miss is a named `MemoryFault`.
use super::race::{self, Hooks, Kind};
use super::{Counters, Ctx, Wave, unsupported};
use crate::decode::{Fam, Inst, src};
use crate::error::EmuError;
use crate::float::{fmax, fmin};
use crate::memory::{APERTURE_SIZE, PRIVATE_BASE, SHARED_BASE, View};
use crate::optable::dsop as d;

#[derive(Clone, Copy, PartialEq)]
enum Space {
    Global,
    Lds,
    Scratch,
}

struct Acc<'a, 'b, H: Hooks> {
    ctx: &'a Ctx<'a>,
    i: &'a Inst,
    pc: u64,
    lds: &'a mut [u8],
    view: Option<&'a mut View<'b>>,
    c: &'a mut Counters,
    /// Race-mode hooks; `atomic`: the instruction is a read-modify-write (for the race check).
    h: &'a mut H,
    atomic: bool,
}

impl<H: Hooks> Acc<'_, '_, H> {
    fn fault(&self, lane: usize, addr: u64, n: usize, what: &'static str) -> EmuError {
        EmuError::MemoryFault {
            kernel: self.ctx.kernel.into(),
            pc: self.pc,
            inst: crate::disasm::text(self.i, self.pc),
            lane: lane as u32,
            addr,
            bytes: n as u32,
            what,
        }
    }
    fn kind(&self, write: bool) -> Kind {
        if self.atomic {
            Kind::Atomic
        } else if write {
            Kind::Write
        } else {
            Kind::Read
        }
    }
    /// Route a FLAT address to its segment.
    fn route(space: Space, addr: u64) -> (Space, u64) {
        if space != Space::Global {
            return (space, addr);
        }
        if (SHARED_BASE..SHARED_BASE + APERTURE_SIZE).contains(&addr) {
            (Space::Lds, addr - SHARED_BASE)
        } else if (PRIVATE_BASE..PRIVATE_BASE + APERTURE_SIZE).contains(&addr) {
            (Space::Scratch, addr - PRIVATE_BASE)
        } else {
            (Space::Global, addr)
        }
    }
    fn rw(
        &mut self,
        w: &mut Wave,
        lane: usize,
        space: Space,
        addr: u64,
        buf: &mut [u8],
        write: bool,
    ) -> Result<(), EmuError> {
        let n = buf.len();
        match space {
            Space::Global => {
                let view = self.view.as_mut().expect("global access without memory view");
                let r = match view.find(addr, n as u64) {
                    Some(r) => r,
                    None => {
                        return Err(self.fault(
                            lane,
                            addr,
                            n,
                            if write { "global write to" } else { "global read from" },
                        ));
                    }
                };
                if H::RACE {
                    self.h.access(self.ctx, race::Space::Global, addr, n, self.kind(write), self.pc, lane as u32)?;
                }
                if write {
                    r.write(addr, buf);
                    self.c.global_written += n as u64;
                } else {
                    r.read(addr, buf);
                    self.c.global_read += n as u64;
                }
            }
            Space::Lds => {
                let a = addr as usize;
                if addr + n as u64 > self.lds.len() as u64 {
                    return Err(self.fault(lane, addr, n, if write { "LDS write to" } else { "LDS read from" }));
                }
                if H::RACE {
                    self.h.access(self.ctx, race::Space::Lds, addr, n, self.kind(write), self.pc, lane as u32)?;
                }
                if write {
                    self.lds[a..a + n].copy_from_slice(buf);
                } else {
                    buf.copy_from_slice(&self.lds[a..a + n]);
                }
                self.c.lds_bytes += n as u64;
            }
            Space::Scratch => {
                let ps = self.ctx.private_size as u64;
                if addr + n as u64 > ps {
                    return Err(self.fault(
                        lane,
                        addr,
                        n,
                        if write { "scratch write to" } else { "scratch read from" },
                    ));
                }
                let a = (lane as u64 * ps + addr) as usize;
                if write {
                    w.scratch[a..a + n].copy_from_slice(buf);
                } else {
                    buf.copy_from_slice(&w.scratch[a..a + n]);
                }
            }
        }
        Ok(())
    }
}

fn rd32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

/// Apply a 32-bit atomic op (shared numbering of FLAT atomics 51-86 after normalisation).
fn atomic32(kind: &str, old: u32, data: u32, cmp: u32) -> u32 {
    match kind {
        "swap" => data,
        "cmpswap" => {
            if old == cmp {
                data
            } else {
                old
            }
        }
        "add" => old.wrapping_add(data),
        "sub" => old.wrapping_sub(data),
        "rsub" => data.wrapping_sub(old),
        "min_i" => (old as i32).min(data as i32) as u32,
        "max_i" => (old as i32).max(data as i32) as u32,
        "min_u" => old.min(data),
        "max_u" => old.max(data),
        "and" => old & data,
        "or" => old | data,
        "xor" => old ^ data,
        "inc" => {
            if old >= data {
                0
            } else {
                old + 1
            }
        }
        "dec" => {
            if old == 0 || old > data {
                data
            } else {
                old - 1
            }
        }
        "add_f" => (f32::from_bits(old) + f32::from_bits(data)).to_bits(),
        "min_f" => fmin(f32::from_bits(old), f32::from_bits(data)).to_bits(),
        "max_f" => fmax(f32::from_bits(old), f32::from_bits(data)).to_bits(),
        "cmpswap_f" => {
            if f32::from_bits(old) == f32::from_bits(cmp) {
                data
            } else {
                old
            }
        }
        _ => old,
    }
}

fn atomic64(kind: &str, old: u64, dv: u64, cv: u64) -> u64 {
    match kind {
        "swap" => dv,
        "cmpswap" => {
            if old == cv {
                dv
            } else {
                old
            }
        }
        "add" => old.wrapping_add(dv),
        "sub" => old.wrapping_sub(dv),
        "rsub" => dv.wrapping_sub(old),
        "min_i" => (old as i64).min(dv as i64) as u64,
        "max_i" => (old as i64).max(dv as i64) as u64,
        "min_u" => old.min(dv),
        "max_u" => old.max(dv),
        "and" => old & dv,
        "or" => old | dv,
        "xor" => old ^ dv,
        "inc" => {
            if old >= dv {
                0
            } else {
                old + 1
            }
        }
        "dec" => {
            if old == 0 || old > dv {
                dv
            } else {
                old - 1
            }
        }
        "min_f64" => crate::float::fmin64(f64::from_bits(old), f64::from_bits(dv)).to_bits(),
        "max_f64" => crate::float::fmax64(f64::from_bits(old), f64::from_bits(dv)).to_bits(),
        "cmpswap_f64" => {
            if f64::from_bits(old) == f64::from_bits(cv) {
                dv
            } else {
                old
            }
        }
        _ => old,
    }
}

fn atomic_kind(name: &str) -> Option<(&'static str, bool)> {
    // (kind, 64-bit)
    let n = name.trim_start_matches("flat_atomic_").trim_start_matches("global_atomic_").trim_start_matches("ds_");
    let wide = n.ends_with("64");
    let base = n.replace("_rtn", "");
    let k = match base.as_str() {
        "swap_b32" | "storexchg_b32" | "swap_b64" | "storexchg_b64" => "swap",
        "cmpswap_b32" | "cmpstore_b32" | "cmpswap_b64" | "cmpstore_b64" => "cmpswap",
        "cmpswap_f32" | "cmpstore_f32" => "cmpswap_f",
        "add_u32" | "add_u64" => "add",
        "sub_u32" | "sub_u64" => "sub",
        "rsub_u32" | "rsub_u64" => "rsub",
        "min_f64" => "min_f64",
        "max_f64" => "max_f64",
        "cmpswap_f64" | "cmpstore_f64" => "cmpswap_f64",
        "min_i32" | "min_i64" => "min_i",
        "max_i32" | "max_i64" => "max_i",
        "min_u32" | "min_u64" => "min_u",
        "max_u32" | "max_u64" => "max_u",
        "and_b32" | "and_b64" => "and",
        "or_b32" | "or_b64" => "or",
        "xor_b32" | "xor_b64" => "xor",
        "inc_u32" | "inc_u64" => "inc",
        "dec_u32" | "dec_u64" => "dec",
        "add_f32" => "add_f",
        "min_f32" => "min_f",
        "max_f32" => "max_f",
        _ => return None,
    };
    Some((k, wide))
}

pub fn ds<H: Hooks>(
    ctx: &Ctx,
    w: &mut Wave,
    i: &Inst,
    pc: u64,
    lds: &mut [u8],
    c: &mut Counters,
    h: &mut H,
) -> Result<(), EmuError> {
    let exec = w.exec();
    let addr = w.v[i.src[0] as usize];
    let (d0, d1) = (i.src[1] as usize, i.src[2] as usize);
    let (off0, off1) = ((i.imm & 0xff) as u64, ((i.imm >> 8) & 0xff) as u64);
    let off = i.imm as u64 & 0xffff;
    let dst = i.dst as usize;
    // Cross-lane ops first: they use LDS hardware but no memory.
    match i.op {
        d::DS_SWIZZLE_B32 => {
            // the swizzled value travels in the ADDR operand
            let s = addr;
            let mut r = [0u32; 32];
            for l in 0..32 {
                let src_lane = if off & 0x8000 != 0 {
                    // rotate/QDMode not used by LLVM wave32 code
                    (l & !3) | ((off as usize >> (2 * (l & 3))) & 3)
                } else {
                    let (and, or, xor) = (off as usize & 0x1f, (off as usize >> 5) & 0x1f, (off as usize >> 10) & 0x1f);
                    ((l & and) | or) ^ xor
                };
                r[l] = if exec >> src_lane & 1 != 0 { s[src_lane] } else { 0 };
            }
            w.vwrite(i.dst, &r);
            return Ok(());
        }
        d::DS_BPERMUTE_B32 | d::DS_PERMUTE_B32 => {
            let s = w.v[d0];
            // lanes nobody writes to (permute) or inactive lanes (bpermute) end up 0
            let mut r = [0u32; 32];
            for l in 0..32 {
                if exec >> l & 1 == 0 {
                    continue;
                }
                let t = ((addr[l] as u64 + off) / 4 % 32) as usize;
                if i.op == d::DS_BPERMUTE_B32 {
                    r[l] = if exec >> t & 1 != 0 { s[t] } else { 0 };
                } else {
                    r[t] = s[l];
                }
            }
            w.vwrite(i.dst, &r);
            return Ok(());
        }
        _ => {}
    }
    let name = i.name();
    let mut a = Acc { ctx, i, pc, lds, view: None, c, h, atomic: false };
    let (load_n, store_n): (usize, usize) = match i.op {
        d::DS_LOAD_B32 => (4, 0),
        d::DS_LOAD_B64 => (8, 0),
        d::DS_LOAD_B96 => (12, 0),
        d::DS_LOAD_B128 => (16, 0),
        d::DS_LOAD_U8
        | d::DS_LOAD_I8
        | d::DS_LOAD_U8_D16
        | d::DS_LOAD_U8_D16_HI
        | d::DS_LOAD_I8_D16
        | d::DS_LOAD_I8_D16_HI => (1, 0),
        d::DS_LOAD_U16 | d::DS_LOAD_I16 | d::DS_LOAD_U16_D16 | d::DS_LOAD_U16_D16_HI => (2, 0),
        d::DS_STORE_B32 => (0, 4),
        d::DS_STORE_B64 => (0, 8),
        d::DS_STORE_B96 => (0, 12),
        d::DS_STORE_B128 => (0, 16),
        d::DS_STORE_B8 | d::DS_STORE_B8_D16_HI => (0, 1),
        d::DS_STORE_B16 | d::DS_STORE_B16_D16_HI => (0, 2),
        _ => (0, 0),
    };
    if H::RACE {
        a.atomic = load_n == 0
            && store_n == 0
            && (matches!(i.op, d::DS_MSKOR_B32 | d::DS_MSKOR_RTN_B32) || atomic_kind(name).is_some());
    }
    for l in 0..32 {
        if exec >> l & 1 == 0 {
            continue;
        }
        let base = addr[l] as u64;
        if load_n > 0 {
            let mut b = [0u8; 16];
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut b[..load_n], false)?;
            let v = rd32(&b);
            let old = w.v[dst][l];
            let val = match i.op {
                d::DS_LOAD_I8 => v as u8 as i8 as i32 as u32,
                d::DS_LOAD_I16 => v as u16 as i16 as i32 as u32,
                d::DS_LOAD_U8 => v & 0xff,
                d::DS_LOAD_U16 => v & 0xffff,
                d::DS_LOAD_U8_D16 => (old & 0xffff_0000) | (v & 0xff),
                d::DS_LOAD_I8_D16 => (old & 0xffff_0000) | (v as u8 as i8 as i16 as u16 as u32),
                d::DS_LOAD_U16_D16 => (old & 0xffff_0000) | (v & 0xffff),
                d::DS_LOAD_U8_D16_HI => (old & 0xffff) | (v & 0xff) << 16,
                d::DS_LOAD_I8_D16_HI => (old & 0xffff) | (v as u8 as i8 as i16 as u16 as u32) << 16,
                d::DS_LOAD_U16_D16_HI => (old & 0xffff) | (v & 0xffff) << 16,
                _ => v,
            };
            w.v[dst][l] = val;
            for k in 1..load_n / 4 {
                w.v[dst + k][l] = rd32(&b[4 * k..]);
            }
        } else if store_n > 0 {
            let mut b = [0u8; 16];
            for k in 0..store_n.div_ceil(4) {
                b[4 * k..4 * k + 4].copy_from_slice(&w.v[d0 + k][l].to_le_bytes());
            }
            if matches!(i.op, d::DS_STORE_B8_D16_HI | d::DS_STORE_B16_D16_HI) {
                let hi = w.v[d0][l] >> 16;
                b[..4].copy_from_slice(&hi.to_le_bytes());
            }
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut b[..store_n], true)?;
        } else if matches!(
            i.op,
            d::DS_LOAD_2ADDR_B32
                | d::DS_LOAD_2ADDR_STRIDE64_B32
                | d::DS_LOAD_2ADDR_B64
                | d::DS_LOAD_2ADDR_STRIDE64_B64
                | d::DS_STORE_2ADDR_B32
                | d::DS_STORE_2ADDR_STRIDE64_B32
                | d::DS_STORE_2ADDR_B64
                | d::DS_STORE_2ADDR_STRIDE64_B64
        ) {
            let wide = matches!(
                i.op,
                d::DS_LOAD_2ADDR_B64
                    | d::DS_LOAD_2ADDR_STRIDE64_B64
                    | d::DS_STORE_2ADDR_B64
                    | d::DS_STORE_2ADDR_STRIDE64_B64
            );
            let n = if wide { 8 } else { 4 };
            let stride = if name.contains("stride64") { 64 * n as u64 } else { n as u64 };
            let store = name.starts_with("ds_store");
            for (k, o) in [off0, off1].into_iter().enumerate() {
                let mut b = [0u8; 8];
                let ad = (base + o * stride) as u32 as u64;
                if store {
                    let reg = if k == 0 { d0 } else { d1 };
                    b[..4].copy_from_slice(&w.v[reg][l].to_le_bytes());
                    if wide {
                        b[4..].copy_from_slice(&w.v[reg + 1][l].to_le_bytes());
                    }
                    a.rw(w, l, Space::Lds, ad, &mut b[..n], true)?;
                } else {
                    a.rw(w, l, Space::Lds, ad, &mut b[..n], false)?;
                    let r = dst + k * (n / 4);
                    w.v[r][l] = rd32(&b);
                    if wide {
                        w.v[r + 1][l] = rd32(&b[4..]);
                    }
                }
            }
        } else if matches!(i.op, d::DS_LOAD_ADDTID_B32 | d::DS_STORE_ADDTID_B32) {
            // address = M0 + offset + lane * 4 (the ADDR operand is unused)
            let ad = (w.s[125] as u64 + off + 4 * l as u64) as u32 as u64;
            let mut b = w.v[d0][l].to_le_bytes();
            if i.op == d::DS_STORE_ADDTID_B32 {
                a.rw(w, l, Space::Lds, ad, &mut b, true)?;
            } else {
                a.rw(w, l, Space::Lds, ad, &mut b, false)?;
                w.v[dst][l] = rd32(&b);
            }
        } else if matches!(i.op, d::DS_MSKOR_B32 | d::DS_MSKOR_RTN_B32) {
            let mut b = [0u8; 4];
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut b, false)?;
            let old = rd32(&b);
            let new = (old & !w.v[d0][l]) | w.v[d1][l];
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut new.to_le_bytes(), true)?;
            if i.op == d::DS_MSKOR_RTN_B32 {
                w.v[dst][l] = old;
            }
        } else if let Some((kind, true)) = atomic_kind(name) {
            let ad = (base + off) as u32 as u64;
            let mut b = [0u8; 8];
            a.rw(w, l, Space::Lds, ad, &mut b, false)?;
            let old = u64::from_le_bytes(b);
            let dv = w.v[d0][l] as u64 | (w.v[d0 + 1][l] as u64) << 32;
            let cv = w.v[d1][l] as u64 | (w.v[d1 + 1][l] as u64) << 32;
            let new = atomic64(kind, old, dv, cv);
            a.rw(w, l, Space::Lds, ad, &mut new.to_le_bytes(), true)?;
            if name.contains("_rtn") {
                w.v[dst][l] = old as u32;
                w.v[dst + 1][l] = (old >> 32) as u32;
            }
        } else if let Some((kind, false)) = atomic_kind(name) {
            let mut b = [0u8; 4];
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut b, false)?;
            let old = rd32(&b);
            // ds_cmpstore: data0 = compare value? LLVM: ds_cmpstore_b32 addr, data(new), cmp
            let (data, cmp) = if kind.starts_with("cmpswap") { (w.v[d0][l], w.v[d1][l]) } else { (w.v[d0][l], 0) };
            let new = atomic32(kind, old, data, cmp);
            a.rw(w, l, Space::Lds, (base + off) as u32 as u64, &mut new.to_le_bytes(), true)?;
            if name.contains("_rtn") {
                w.v[dst][l] = old;
            }
        } else {
            return Err(unsupported(ctx, pc, i, "DS opcode not implemented"));
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn flat<H: Hooks>(
    ctx: &Ctx,
    w: &mut Wave,
    i: &Inst,
    pc: u64,
    lds: &mut [u8],
    view: &mut View,
    c: &mut Counters,
    h: &mut H,
) -> Result<(), EmuError> {
    let exec = w.exec();
    let space = if i.fam == Fam::Scratch { Space::Scratch } else { Space::Global };
    let vaddr = i.src[0] as usize;
    let data = i.src[1] as usize;
    let dst = i.dst as usize;
    let name = i.name();
    let op = i.op;
    let atomic = H::RACE && !matches!(op, 16..=37);
    let mut a = Acc { ctx, i, pc, lds, view: Some(view), c, h, atomic };
    for l in 0..32 {
        if exec >> l & 1 == 0 {
            continue;
        }
        let addr = match i.fam {
            Fam::Global if i.saddr != src::NULL && i.saddr != 0x7c => {
                w.sval64(i.saddr, 0, false).wrapping_add(w.v[vaddr][l] as u64)
            }
            Fam::Global | Fam::Flat => w.v[vaddr][l] as u64 | (w.v[(vaddr + 1) % 256][l] as u64) << 32,
            _ => {
                let s = if i.saddr != src::NULL && i.saddr != 0x7c { w.sval(i.saddr, 0) as u64 } else { 0 };
                let v = if i.flags & 8 != 0 { w.v[vaddr][l] as u64 } else { 0 };
                s + v
            }
        }
        .wrapping_add(i.imm as i64 as u64);
        let (sp, ad) = Acc::<H>::route(space, addr);
        match op {
            16..=23 | 30..=35 => {
                let n = match op {
                    16 | 17 | 30 | 31 | 33 | 34 => 1,
                    18 | 19 | 32 | 35 => 2,
                    20 => 4,
                    21 => 8,
                    22 => 12,
                    _ => 16,
                };
                let mut b = [0u8; 16];
                a.rw(w, l, sp, ad, &mut b[..n], false)?;
                let v = rd32(&b);
                let old = w.v[dst][l];
                w.v[dst][l] = match op {
                    16 => v & 0xff,
                    17 => v as u8 as i8 as i32 as u32,
                    18 => v & 0xffff,
                    19 => v as u16 as i16 as i32 as u32,
                    30 => (old & 0xffff_0000) | (v & 0xff),
                    31 => (old & 0xffff_0000) | (v as u8 as i8 as i16 as u16 as u32),
                    32 => (old & 0xffff_0000) | (v & 0xffff),
                    33 => (old & 0xffff) | (v & 0xff) << 16,
                    34 => (old & 0xffff) | (v as u8 as i8 as i16 as u16 as u32) << 16,
                    35 => (old & 0xffff) | (v & 0xffff) << 16,
                    _ => v,
                };
                for k in 1..n / 4 {
                    w.v[(dst + k) % 256][l] = rd32(&b[4 * k..]);
                }
            }
            24..=29 | 36 | 37 => {
                let n: usize = match op {
                    24 | 36 => 1,
                    25 | 37 => 2,
                    26 => 4,
                    27 => 8,
                    28 => 12,
                    _ => 16,
                };
                let mut b = [0u8; 16];
                for k in 0..n.div_ceil(4) {
                    b[4 * k..4 * k + 4].copy_from_slice(&w.v[(data + k) % 256][l].to_le_bytes());
                }
                if op >= 36 {
                    let hi = w.v[data][l] >> 16;
                    b[..4].copy_from_slice(&hi.to_le_bytes());
                }
                a.rw(w, l, sp, ad, &mut b[..n], true)?;
            }
            _ => {
                let Some((kind, wide)) = atomic_kind(name) else {
                    return Err(unsupported(ctx, pc, i, "FLAT opcode not implemented"));
                };
                let _g = ctx.mem.atomic_lock.lock().map_err(|_| EmuError::Api("atomic lock poisoned".into()))?;
                if wide {
                    let mut b = [0u8; 8];
                    a.rw(w, l, sp, ad, &mut b, false)?;
                    let old = u64::from_le_bytes(b);
                    let dv = w.v[data][l] as u64 | (w.v[data + 1][l] as u64) << 32;
                    let cv =
                        if kind == "cmpswap" { w.v[data + 2][l] as u64 | (w.v[data + 3][l] as u64) << 32 } else { 0 };
                    let new = atomic64(kind, old, dv, cv);
                    a.rw(w, l, sp, ad, &mut new.to_le_bytes(), true)?;
                    if i.flags & 1 != 0 {
                        w.v[dst][l] = old as u32;
                        w.v[dst + 1][l] = (old >> 32) as u32;
                    }
                } else {
                    let mut b = [0u8; 4];
                    a.rw(w, l, sp, ad, &mut b, false)?;
                    let old = rd32(&b);
                    let cmp = if kind.starts_with("cmpswap") { w.v[data + 1][l] } else { 0 };
                    let new = atomic32(kind, old, w.v[data][l], cmp);
                    a.rw(w, l, sp, ad, &mut new.to_le_bytes(), true)?;
                    if i.flags & 1 != 0 {
                        w.v[dst][l] = old;
                    }
                }
            }
        }
    }
    Ok(())
}
