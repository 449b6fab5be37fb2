//! Device memory: a sparse 64-bit address space of allocations, each a run of relaxed atomic
//! bytes so that workgroups running on several host threads may share buffers without data
//! races. Addresses outside every allocation are faults; there is no "nearby" memory.
use crate::error::EmuError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

/// First device address handed out; far from 0 so null pointers fault.
const HEAP_BASE: u64 = 0x0000_7f00_0000_0000;
/// Gap left between allocations so small overruns land in no allocation.
const GUARD: u64 = 1 << 16;
/// FLAT apertures (what `src_shared_base` / `src_private_base` return): LDS and scratch windows.
pub const SHARED_BASE: u64 = 0x0001_0000_0000_0000;
pub const PRIVATE_BASE: u64 = 0x0002_0000_0000_0000;
pub const APERTURE_SIZE: u64 = 1 << 32;

pub struct Region {
    pub base: u64,
    pub bytes: Box<[AtomicU8]>,
}
impl Region {
    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    #[inline]
    pub fn contains(&self, addr: u64, n: u64) -> bool {
        addr >= self.base && addr.wrapping_add(n) <= self.base + self.len() && addr.wrapping_add(n) >= addr
    }
    #[inline]
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        let o = (addr - self.base) as usize;
        let n = out.len();
        for (d, s) in out.iter_mut().zip(&self.bytes[o..o + n]) {
            *d = s.load(Relaxed);
        }
    }
    #[inline]
    pub fn write(&self, addr: u64, src: &[u8]) {
        let o = (addr - self.base) as usize;
        for (d, s) in self.bytes[o..o + src.len()].iter().zip(src) {
            d.store(*s, Relaxed);
        }
    }
}

#[derive(Default)]
pub struct Memory {
    regions: RwLock<BTreeMap<u64, Arc<Region>>>,
    next: Mutex<u64>,
    /// Serialises read-modify-write atomics across host threads.
    pub atomic_lock: Mutex<()>,
}

impl Memory {
    pub fn alloc(&self, bytes: usize) -> Result<u64, EmuError> {
        let size = (bytes.max(1) as u64 + 255) & !255;
        let mut next = self.next.lock().map_err(|_| EmuError::Api("memory lock poisoned".into()))?;
        if *next == 0 {
            *next = HEAP_BASE;
        }
        let base = *next;
        if base.checked_add(size + GUARD).is_none_or(|e| e >= SHARED_BASE + (1 << 62)) {
            return Err(EmuError::Alloc { bytes, reason: "device address space exhausted".into() });
        }
        let mut v = Vec::new();
        v.try_reserve_exact(bytes).map_err(|e| EmuError::Alloc { bytes, reason: e.to_string() })?;
        v.resize_with(bytes, || AtomicU8::new(0));
        *next = (base + size + GUARD + 4095) & !4095;
        let r = Arc::new(Region { base, bytes: v.into_boxed_slice() });
        self.regions.write().map_err(|_| EmuError::Api("memory lock poisoned".into()))?.insert(base, r);
        Ok(base)
    }
    pub fn free(&self, p: u64) -> Result<(), EmuError> {
        let mut m = self.regions.write().map_err(|_| EmuError::Api("memory lock poisoned".into()))?;
        m.remove(&p).map(|_| ()).ok_or_else(|| EmuError::Api(format!("free({p:#x}): not the start of an allocation")))
    }
    /// The allocation holding `[addr, addr+n)`, if one does.
    pub fn region(&self, addr: u64, n: u64) -> Option<Arc<Region>> {
        let m = self.regions.read().ok()?;
        let (_, r) = m.range(..=addr).next_back()?;
        if r.contains(addr, n) { Some(r.clone()) } else { None }
    }
    /// All live allocations, sorted by base (a launch works on this snapshot).
    pub fn snapshot(&self) -> Vec<Arc<Region>> {
        self.regions.read().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
    pub fn copy_in(&self, dst: u64, src: &[u8]) -> Result<(), EmuError> {
        let r = self.region(dst, src.len() as u64).ok_or_else(|| {
            EmuError::Api(format!("memcpy to {dst:#x}+{} bytes: outside every allocation", src.len()))
        })?;
        r.write(dst, src);
        Ok(())
    }
    pub fn copy_out(&self, dst: &mut [u8], src: u64) -> Result<(), EmuError> {
        let r = self.region(src, dst.len() as u64).ok_or_else(|| {
            EmuError::Api(format!("memcpy from {src:#x}+{} bytes: outside every allocation", dst.len()))
        })?;
        r.read(src, dst);
        Ok(())
    }
}

/// Lock-free lookup over a launch's snapshot, with a one-entry cache.
pub struct View<'a> {
    pub regions: &'a [Arc<Region>],
    last: usize,
}
impl<'a> View<'a> {
    pub fn new(regions: &'a [Arc<Region>]) -> View<'a> {
        View { regions, last: 0 }
    }
    #[inline]
    pub fn find(&mut self, addr: u64, n: u64) -> Option<&'a Region> {
        if let Some(r) = self.regions.get(self.last)
            && r.contains(addr, n)
        {
            return Some(r);
        }
        let i = self.regions.partition_point(|r| r.base <= addr).checked_sub(1)?;
        let r = &self.regions[i];
        if r.contains(addr, n) {
            self.last = i;
            Some(r)
        } else {
            None
        }
    }
}
