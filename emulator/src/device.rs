//! The HIP-shaped device API: modules, memory, launches, statistics.
use crate::decode::{self, Fam, Inst};
use crate::error::EmuError;
use crate::exec::race::{self, RaceState};
use crate::exec::{self, Counters, Ctx, Program, Stop, Wave};
use crate::loader::{self, KernelDescriptor};
pub use crate::loader::{KernArg, KernelInfo};
use crate::memory::{Memory, View};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

pub type DevicePtr = u64;

/// Default per-wave instruction budget before "did not terminate".
pub const DEFAULT_BUDGET: u64 = 200_000_000;

/// Options of every launch on a [`Device`] (see [`Device::set_options`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Per-wave instruction budget before "did not terminate".
    pub instruction_budget: u64,
    /// Race mode: `Some(seed)` runs the waves of each workgroup in a random interleaving drawn
    /// from `seed` (switching waves at every barrier and after random instruction counts) and
    /// fails a launch whose waves race on LDS or global memory with [`EmuError::DataRace`].
    /// Slower; `None` (the default) is the normal scheduler. [`Device::new`] takes it from
    /// `STRATA_EMU_RACE_SEED` ([`RACE_SEED_ENV`]).
    pub race_seed: Option<u64>,
    /// Instructions of one whole launch, all waves together (None: unbounded, the default).
    /// Checked before each workgroup starts, so a launch past it stops within the work of the
    /// workgroups already running, with an error naming the budget.
    pub launch_budget: Option<u64>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions { instruction_budget: DEFAULT_BUDGET, race_seed: None, launch_budget: None }
    }
}

pub use race::RACE_SEED_ENV;

pub struct Device {
    mem: Arc<Memory>,
    fail_pinned_above: Mutex<Option<usize>>,
    options: Mutex<LaunchOptions>,
    /// A malformed `STRATA_EMU_RACE_SEED`: every launch fails with it (rather than silently
    /// running without the race checks that were asked for).
    env_error: Option<String>,
}

impl Default for Device {
    fn default() -> Self {
        Device::new()
    }
}

struct ModuleInner {
    prog: Program,
    kernels: Vec<(KernelInfo, KernelDescriptor)>,
    base: u64,
    /// The device memory holding the image, released when the last handle goes.
    mem: std::sync::Weak<Memory>,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        if let Some(m) = self.mem.upgrade() {
            let _ = m.free(self.base);
        }
    }
}

/// A loaded code object.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

/// One kernel of a module.
#[derive(Clone)]
pub struct Function {
    module: Arc<ModuleInner>,
    index: usize,
}

impl Function {
    pub fn info(&self) -> &KernelInfo {
        &self.module.kernels[self.index].0
    }
}

impl Module {
    pub fn function(&self, name: &str) -> Result<Function, EmuError> {
        let index = self
            .inner
            .kernels
            .iter()
            .position(|(k, _)| k.name == name)
            .ok_or_else(|| EmuError::NoSuchKernel(name.into()))?;
        Ok(Function { module: self.inner.clone(), index })
    }
    pub fn kernels(&self) -> Vec<KernelInfo> {
        self.inner.kernels.iter().map(|(k, _)| k.clone()).collect()
    }
    /// Device address where the code object image starts.
    pub fn base(&self) -> DevicePtr {
        self.inner.base
    }
}

/// Counters of one launch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Kernel launches counted (1 for one launch; sums count launches).
    pub launches: u64,
    pub instructions: u64,
    pub by_family: BTreeMap<String, u64>,
    pub lane_ops: u64,
    pub global_bytes_read: u64,
    pub global_bytes_written: u64,
    pub lds_bytes: u64,
    pub waves: u64,
}

const FAM_NAMES: [&str; 21] = [
    "sop2", "sopk", "sop1", "sopc", "sopp", "smem", "valu", "vop3p", "vopd", "ds", "flat", "global", "scratch",
    "invalid", "cache", "mubuf", "mtbuf", "mimg", "exp", "vinterp", "ldsdir",
];

/// Decode every instruction reachable from the kernel entries and function symbols, once. A
/// reachable word that is no known instruction refuses the whole code object (naming the
/// kernel or function it was reached from, its address and its words): never a guess.
fn decode_program(co: &loader::CodeObject, base: u64) -> Result<Program, EmuError> {
    let words: Vec<u32> = co
        .image
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect();
    // Instructions live in text: decoded entries up to the end of the last executable segment
    // only (a large zero-filled data segment must not cost an `Inst` per word).
    let text_words = co.text.iter().map(|t| t.1.div_ceil(4) as usize).max().unwrap_or(0).min(words.len());
    let mut insts = vec![Inst::INVALID; text_words];
    let mut seen = vec![false; text_words];
    // (word index, root): root < kernels.len() is a kernel, else a function symbol
    let nk = co.kernels.len();
    let mut work: Vec<(usize, usize)> =
        co.kernels.iter().enumerate().map(|(r, (_, d))| ((d.entry / 4) as usize, r)).collect();
    work.extend(co.functions.iter().enumerate().map(|(r, (_, a))| ((*a / 4) as usize, nk + r)));
    let in_text = |idx: usize| co.text.iter().any(|t| (idx as u64 * 4) >= t.0 && (idx as u64 * 4) < t.1);
    while let Some((idx, root)) = work.pop() {
        if idx >= text_words || seen[idx] || !in_text(idx) {
            continue;
        }
        seen[idx] = true;
        match decode::decode(&words[idx..]) {
            Ok(i) => {
                insts[idx] = i;
                let next = idx + i.len as usize / 4;
                let sopp = i.fam == Fam::Sopp;
                let name = i.name();
                let ends = sopp && (name.starts_with("s_endpgm") || name == "s_branch" || name == "s_code_end")
                    || (i.fam == Fam::Sop1 && name == "s_setpc_b64");
                if sopp && (name.starts_with("s_cbranch") || name == "s_branch") {
                    work.push(((idx as i64 + 1 + i.imm as i64) as usize, root));
                }
                if i.fam == Fam::Sopk && name == "s_call_b64" {
                    work.push(((idx as i64 + 1 + i.imm as i64) as usize, root));
                }
                if !ends {
                    work.push((next, root));
                }
            }
            Err(e) => {
                let kernel =
                    if root < nk { co.kernels[root].0.name.clone() } else { co.functions[root - nk].0.clone() };
                let n = decode::shown_words(words[idx]).min(words.len() - idx);
                return Err(EmuError::UnknownEncoding {
                    kernel,
                    pc: idx as u64 * 4,
                    words: words[idx..idx + n].to_vec(),
                    what: e.0,
                });
            }
        }
    }
    let kernel_names = co.kernels.iter().map(|(k, d)| (d.entry, k.name.clone())).collect();
    Ok(Program { base, insts, kernel_names, words })
}

impl Device {
    /// A device with default options, except race mode when `STRATA_EMU_RACE_SEED` is set.
    pub fn new() -> Device {
        let (race_seed, env_error) = match race::race_seed_from_env() {
            Ok(s) => (s, None),
            Err(e) => (None, Some(e)),
        };
        Device {
            mem: Arc::new(Memory::default()),
            fail_pinned_above: Mutex::new(None),
            options: Mutex::new(LaunchOptions { race_seed, ..LaunchOptions::default() }),
            env_error,
        }
    }
    /// The options launches use now.
    pub fn options(&self) -> LaunchOptions {
        self.options.lock().map(|o| o.clone()).unwrap_or_default()
    }
    /// Replace the launch options (race mode, instruction budget).
    pub fn set_options(&self, o: LaunchOptions) {
        if let Ok(mut x) = self.options.lock() {
            *x = o;
        }
    }
    /// Change the per-wave instruction budget (tests of "did not terminate").
    pub fn set_instruction_budget(&self, n: u64) {
        if let Ok(mut x) = self.options.lock() {
            x.instruction_budget = n;
        }
    }
    /// Bound the instructions of one launch, all waves together (None: unbounded).
    pub fn set_launch_budget(&self, n: Option<u64>) {
        if let Ok(mut x) = self.options.lock() {
            x.launch_budget = n;
        }
    }
    /// Race mode on (`Some(seed)`) or off for the following launches.
    pub fn set_race_seed(&self, seed: Option<u64>) {
        if let Ok(mut x) = self.options.lock() {
            x.race_seed = seed;
        }
    }

    pub fn load_module(&self, code_object: &[u8]) -> Result<Module, EmuError> {
        let co = loader::load(code_object)?;
        let base = self.mem.alloc(co.image.len())?;
        let prog = match decode_program(&co, base) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.mem.free(base);
                return Err(e);
            }
        };
        self.mem.copy_in(base, &co.image)?;
        Ok(Module { inner: Arc::new(ModuleInner { prog, kernels: co.kernels, base, mem: Arc::downgrade(&self.mem) }) })
    }
    pub fn malloc(&self, bytes: usize) -> Result<DevicePtr, EmuError> {
        self.mem.alloc(bytes)
    }
    pub fn free(&self, p: DevicePtr) -> Result<(), EmuError> {
        self.mem.free(p)
    }
    /// Pinned host memory stand-in (device-visible); fails above the test threshold.
    pub fn host_malloc_pinned(&self, bytes: usize) -> Result<DevicePtr, EmuError> {
        if let Some(t) = *self.fail_pinned_above.lock().map_err(|_| EmuError::Api("lock poisoned".into()))?
            && bytes > t
        {
            return Err(EmuError::Alloc {
                bytes,
                reason: format!("pinned allocation above the test threshold of {t} bytes"),
            });
        }
        self.mem.alloc(bytes)
    }
    /// Make `host_malloc_pinned` fail for requests above `bytes_threshold` (None: never).
    pub fn set_fail_large_pinned_alloc(&self, bytes_threshold: Option<usize>) {
        if let Ok(mut t) = self.fail_pinned_above.lock() {
            *t = bytes_threshold;
        }
    }
    pub fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), EmuError> {
        self.mem.copy_in(dst, src)
    }
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), EmuError> {
        self.mem.copy_out(dst, src)
    }
    pub fn memcpy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), EmuError> {
        let mut tmp = vec![0u8; bytes];
        self.mem.copy_out(&mut tmp, src)?;
        self.mem.copy_in(dst, &tmp)
    }
    pub fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<(), EmuError> {
        self.mem.copy_in(dst, &vec![byte; bytes])
    }

    /// Run a grid of `grid` workgroups of `block` work-items each.
    pub fn launch(
        &self,
        f: &Function,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_lds: u32,
        kernargs: &[u8],
    ) -> Result<LaunchStats, EmuError> {
        let (info, kd) = &f.module.kernels[f.index];
        let api = |s: String| EmuError::Api(format!("launch {}: {s}", info.name));
        if let Some(e) = &self.env_error {
            return Err(api(e.clone()));
        }
        let opts = self.options.lock().map_err(|_| api("lock poisoned".into()))?.clone();
        if grid.contains(&0) || block.contains(&0) {
            return Err(api(format!("empty grid {grid:?} / block {block:?}")));
        }
        let threads = block[0] as u64 * block[1] as u64 * block[2] as u64;
        // The dispatch packet holds the grid size in work-items, 32 bits per dimension.
        if let Some(d) = (0..3).find(|&d| grid[d] as u64 * block[d] as u64 > u32::MAX as u64) {
            return Err(api(format!(
                "grid {grid:?} x block {block:?} is {} work-items in dimension {d}, more than the 4294967295 a dispatch holds",
                grid[d] as u64 * block[d] as u64
            )));
        }
        let groups = (grid[0] as u64).checked_mul(grid[1] as u64).and_then(|n| n.checked_mul(grid[2] as u64));
        if groups.and_then(|n| n.checked_mul(threads.div_ceil(32))).is_none() {
            return Err(api(format!("grid {grid:?} x block {block:?} has more than 2^64 waves")));
        }
        let max = if info.max_flat_workgroup_size == 0 { 1024 } else { info.max_flat_workgroup_size } as u64;
        if threads > max.min(1024) {
            return Err(api(format!("block {block:?} has {threads} work-items, kernel allows {max}")));
        }
        let lds_size = kd.group_segment_size as u64 + dynamic_lds as u64;
        if lds_size > 65536 {
            return Err(api(format!(
                "LDS {} static + {dynamic_lds} dynamic bytes exceeds 64 KiB",
                kd.group_segment_size
            )));
        }
        let explicit_end = info
            .args
            .iter()
            .filter(|a| !a.value_kind.starts_with("hidden_"))
            .map(|a| a.offset + a.size)
            .max()
            .unwrap_or(0);
        if (kernargs.len() as u32) < explicit_end {
            return Err(api(format!("kernel arguments are {} bytes, the kernel reads {explicit_end}", kernargs.len())));
        }
        // Kernarg segment: caller bytes, then hidden arguments the metadata declares (owned by
        // the runtime, as in HIP: filled even when the caller passed bytes there).
        let ka_size = (info.kernarg_size.max(kd.kernarg_size) as usize).max(kernargs.len()).max(8);
        let mut ka = vec![0u8; ka_size];
        ka[..kernargs.len()].copy_from_slice(kernargs);
        for a in info.args.iter().filter(|a| a.value_kind.starts_with("hidden_")) {
            let put = |ka: &mut Vec<u8>, v: u64| {
                let o = a.offset as usize;
                let n = (a.size as usize).min(8);
                if o + n <= ka.len() {
                    ka[o..o + n].copy_from_slice(&v.to_le_bytes()[..n]);
                }
            };
            match a.value_kind.as_str() {
                "hidden_block_count_x" => put(&mut ka, grid[0] as u64),
                "hidden_block_count_y" => put(&mut ka, grid[1] as u64),
                "hidden_block_count_z" => put(&mut ka, grid[2] as u64),
                "hidden_group_size_x" => put(&mut ka, block[0] as u64),
                "hidden_group_size_y" => put(&mut ka, block[1] as u64),
                "hidden_group_size_z" => put(&mut ka, block[2] as u64),
                "hidden_grid_dims" => put(
                    &mut ka,
                    if grid[2] * block[2] > 1 {
                        3
                    } else if grid[1] * block[1] > 1 {
                        2
                    } else {
                        1
                    },
                ),
                "hidden_dynamic_lds_size" => put(&mut ka, dynamic_lds as u64),
                _ => {}
            }
        }
        let ka_ptr = self.mem.alloc(ka.len())?;
        self.mem.copy_in(ka_ptr, &ka)?;
        // HSA kernel dispatch packet (64 bytes).
        let mut pkt = [0u8; 64];
        let dims: u16 = if grid[2] * block[2] > 1 {
            3
        } else if grid[1] * block[1] > 1 {
            2
        } else {
            1
        };
        pkt[2..4].copy_from_slice(&dims.to_le_bytes());
        for d in 0..3 {
            pkt[4 + 2 * d..6 + 2 * d].copy_from_slice(&(block[d] as u16).to_le_bytes());
            pkt[12 + 4 * d..16 + 4 * d].copy_from_slice(&(grid[d].wrapping_mul(block[d])).to_le_bytes());
        }
        pkt[24..28].copy_from_slice(&kd.private_segment_size.to_le_bytes());
        pkt[28..32].copy_from_slice(&(lds_size as u32).to_le_bytes());
        pkt[40..48].copy_from_slice(&ka_ptr.to_le_bytes());
        let pkt_ptr = self.mem.alloc(64)?;
        self.mem.copy_in(pkt_ptr, &pkt)?;

        let regions = self.mem.snapshot();
        let ctx = Ctx {
            prog: &f.module.prog,
            kernel: &info.name,
            regions: &regions,
            mem: &self.mem,
            budget: opts.instruction_budget,
            f32_denorm: kd.f32_denorm_mode() == 3,
            f16_denorm: kd.f16_denorm_mode() == 3,
            ieee: kd.ieee(),
            private_size: kd.private_segment_size.max(info.private_segment_size),
        };
        let n_groups = grid[0] as u64 * grid[1] as u64 * grid[2] as u64;
        // Wave register files are reused between the workgroups a host thread runs (their
        // initial VGPR contents are undefined on hardware too), which avoids zeroing 35 KB per wave.
        let seed = opts.race_seed;
        let new_cache = || GroupCache { waves: Vec::new(), race: seed.map(RaceState::new) };
        let launch_budget = opts.launch_budget.unwrap_or(u64::MAX);
        let spent = std::sync::atomic::AtomicU64::new(0);
        let run_group = |cache: &mut GroupCache, g: u64| -> Result<Counters, EmuError> {
            let gid = [
                (g % grid[0] as u64) as u32,
                ((g / grid[0] as u64) % grid[1] as u64) as u32,
                (g / (grid[0] as u64 * grid[1] as u64)) as u32,
            ];
            let r = run_workgroup(&ctx, kd, gid, block, threads as u32, lds_size as usize, pkt_ptr, ka_ptr, cache);
            let ran = match &r {
                Ok(c) => c.by_fam.iter().sum(),
                Err(EmuError::Budget { budget, .. }) => *budget,
                Err(_) => 0,
            };
            spent.fetch_add(ran, std::sync::atomic::Ordering::Relaxed);
            r
        };
        // Counters are summed as workgroups finish (not kept per workgroup: 3 M workgroups
        // took 494 MB); the error reported is the one of the first workgroup that failed, as if
        // they ran in order. A workgroup that would start past the launch budget stops the
        // launch (Err(its index)).
        type Acc = (Counters, Option<(u64, EmuError)>);
        let add = |mut a: Acc, b: Acc| -> Result<Acc, u64> {
            for (x, y) in a.0.by_fam.iter_mut().zip(b.0.by_fam) {
                *x += y;
            }
            a.0.lane_ops += b.0.lane_ops;
            a.0.global_read += b.0.global_read;
            a.0.global_written += b.0.global_written;
            a.0.lds_bytes += b.0.lds_bytes;
            if let Some(e) = b.1
                && a.1.as_ref().is_none_or(|f| e.0 < f.0)
            {
                a.1 = Some(e);
            }
            Ok(a)
        };
        let one = |cache: &mut GroupCache, g: u64| -> Result<Acc, u64> {
            if spent.load(std::sync::atomic::Ordering::Relaxed) > launch_budget {
                return Err(g);
            }
            Ok(match run_group(cache, g) {
                Ok(c) => (c, None),
                Err(e) => (Counters::default(), Some((g, e))),
            })
        };
        let result = if n_groups > 1 {
            (0..n_groups).into_par_iter().map_init(new_cache, one).try_reduce(|| (Counters::default(), None), add)
        } else {
            one(&mut new_cache(), 0)
        };
        let _ = self.mem.free(ka_ptr);
        let _ = self.mem.free(pkt_ptr);
        let (c, err) = result.map_err(|g| api(format!(
            "the launch ran more than {launch_budget} instructions in all (its launch budget), stopped before workgroup {g} of {n_groups}"
        )))?;
        if let Some((_, e)) = err {
            return Err(e);
        }
        let mut st = LaunchStats { launches: 1, waves: n_groups * threads.div_ceil(32), ..Default::default() };
        for (k, n) in c.by_fam.iter().enumerate() {
            if *n > 0 {
                *st.by_family.entry(FAM_NAMES[k].into()).or_default() += n;
                st.instructions += n;
            }
        }
        st.lane_ops = c.lane_ops;
        st.global_bytes_read = c.global_read;
        st.global_bytes_written = c.global_written;
        st.lds_bytes = c.lds_bytes;
        Ok(st)
    }
}

/// What a host thread keeps between the workgroups it runs.
struct GroupCache {
    waves: Vec<Wave>,
    /// Race-mode state (None in the normal mode).
    race: Option<RaceState>,
}

#[allow(clippy::too_many_arguments)]
fn run_workgroup(
    ctx: &Ctx,
    kd: &KernelDescriptor,
    gid: [u32; 3],
    block: [u32; 3],
    threads: u32,
    lds_size: usize,
    pkt: u64,
    ka: u64,
    gc: &mut GroupCache,
) -> Result<Counters, EmuError> {
    let cache = &mut gc.waves;
    let mut lds = vec![0u8; lds_size];
    let mut view = View::new(ctx.regions);
    let mut c = Counters::default();
    let n_waves = threads.div_ceil(32);
    let mut waves: Vec<Wave> = (0..n_waves)
        .map(|wi| {
            let mut w = match cache.pop() {
                Some(mut w) => {
                    w.reset(ctx);
                    w
                }
                None => Wave::new(ctx),
            };
            w.pc = ctx.prog.base + kd.entry;
            let mut s = 0usize;
            let mut put = |w: &mut Wave, v: u32| {
                if s < 106 {
                    w.s[s] = v;
                }
                s += 1;
            };
            // private segment buffer descriptor (pre-gfx11 style scratch; unused by the device)
            if kd.properties & 1 != 0 {
                for _ in 0..4 {
                    put(&mut w, 0);
                }
            }
            if kd.enable_dispatch_ptr() {
                put(&mut w, pkt as u32);
                put(&mut w, (pkt >> 32) as u32);
            }
            if kd.enable_queue_ptr() {
                put(&mut w, 0);
                put(&mut w, 0);
            }
            if kd.enable_kernarg_ptr() {
                put(&mut w, ka as u32);
                put(&mut w, (ka >> 32) as u32);
            }
            if kd.enable_dispatch_id() {
                put(&mut w, 0);
                put(&mut w, 0);
            }
            if kd.properties & (1 << 5) != 0 {
                put(&mut w, 0);
                put(&mut w, 0);
            } // flat scratch init
            if kd.enable_private_segment_size() {
                put(&mut w, ctx.private_size);
            }
            let mut s = kd.user_sgpr_count() as usize;
            for d in 0..3 {
                if kd.enable_wg_id(d) {
                    w.s[s] = gid[d];
                    s += 1;
                }
            }
            if kd.enable_wg_info() {
                w.s[s] = 0;
                s += 1;
            }
            if kd.enable_private_segment() {
                w.s[s] = 0;
            }
            let mut exec = 0u32;
            for l in 0..32u32 {
                let t = wi * 32 + l;
                if t < threads {
                    exec |= 1 << l;
                    let (x, y, z) = (t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1]));
                    w.v[0][l as usize] = x | y << 10 | z << 20;
                }
            }
            w.s[decode::src::EXEC_LO as usize] = exec;
            w
        })
        .collect();
    let r = match gc.race.as_mut() {
        None => schedule_in_order(ctx, &mut waves, &mut lds, &mut view, &mut c),
        Some(race) => schedule_random(ctx, &mut waves, &mut lds, &mut view, &mut c, race, gid),
    };
    gc.waves.extend(waves);
    r.map(|()| c)
}

/// The normal scheduler: each wave in turn runs until it ends or reaches a barrier; when every
/// live wave waits, all are released.
fn schedule_in_order(
    ctx: &Ctx,
    waves: &mut [Wave],
    lds: &mut [u8],
    view: &mut View,
    c: &mut Counters,
) -> Result<(), EmuError> {
    loop {
        let mut progressed = false;
        for w in waves.iter_mut() {
            if w.done || w.at_barrier {
                continue;
            }
            progressed = true;
            let _ = exec::run(ctx, w, lds, view, c)?;
        }
        let all_done = waves.iter().all(|w| w.done);
        if all_done {
            return Ok(());
        }
        if waves.iter().all(|w| w.done || w.at_barrier) {
            // every live wave is at the barrier: release them (ended waves do not block it)
            for w in waves.iter_mut() {
                w.at_barrier = false;
            }
        } else if !progressed {
            let pc = waves.iter().find(|w| !w.done).map(|w| w.pc).unwrap_or(0);
            return Err(EmuError::Deadlock { kernel: ctx.kernel.into(), pc });
        }
    }
}

/// Race mode: a random runnable wave runs for a random number of instructions (or until it
/// ends or reaches a barrier), again and again; the race checks see every LDS/global access.
fn schedule_random(
    ctx: &Ctx,
    waves: &mut [Wave],
    lds: &mut [u8],
    view: &mut View,
    c: &mut Counters,
    race: &mut RaceState,
    gid: [u32; 3],
) -> Result<(), EmuError> {
    race.start_workgroup(gid, lds.len());
    let mut runnable: Vec<usize> = Vec::with_capacity(waves.len());
    loop {
        runnable.clear();
        runnable.extend((0..waves.len()).filter(|&k| !waves[k].done && !waves[k].at_barrier));
        if runnable.is_empty() {
            if waves.iter().all(|w| w.done) {
                return Ok(());
            }
            for w in waves.iter_mut() {
                w.at_barrier = false;
            }
            race.barrier();
            continue;
        }
        let k = runnable[race.rng.below_u64(runnable.len() as u64) as usize];
        race.wave = k as u16;
        race.slice = race.pick_slice();
        match exec::run_with(ctx, &mut waves[k], lds, view, c, race)? {
            Stop::Barrier | Stop::End | Stop::Slice => {}
        }
    }
}
