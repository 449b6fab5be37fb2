//! `strata emu ...`: the software RDNA3 device from the command line. Works on any gfx11 code
//! object (ours, or one written by hand with llvm-mc), independent of models.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use emulator::{Device, DevicePtr, KernelInfo, LaunchStats};

#[derive(Args, Debug)]
pub struct EmuArgs {
    #[command(subcommand)]
    pub command: EmuCmd,
}

#[derive(Subcommand, Debug)]
pub enum EmuCmd {
    /// Print every instruction of a code object in LLVM syntax, as `llvm-objdump-22 -d` does.
    Disasm {
        /// A gfx11 code object (ELF), e.g. target/.../kernels-gfx1100.elf.
        file: PathBuf,
    },
    /// List the kernels of a code object with their metadata (arguments, LDS, scratch, registers).
    List {
        /// A gfx11 code object (ELF).
        file: PathBuf,
    },
    /// Run one kernel on the software device and print its counters.
    ///
    /// Arguments are given in the kernel's declared order (hidden arguments are filled by the
    /// device), one `--arg` each:
    ///   in=FILE            a buffer initialised from FILE (read-only use)
    ///   out=FILE:BYTES     a zeroed buffer of BYTES bytes, written to FILE after the run
    ///   inout=FILE         a buffer initialised from FILE and written back to FILE
    ///   zero=BYTES         a zeroed scratch buffer, discarded
    ///   null               a null pointer
    ///   u32=N i32=N u64=N i64=N f32=X u16=N u8=N   a scalar passed by value
    /// Example:
    ///   strata emu run k.elf dequant_q8_0_f32 --grid 4,1,1 --block 256,1,1 \
    ///     --arg in=w.bin --arg u32=32 --arg out=y.bin:4096
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A gfx11 code object (ELF).
    pub file: PathBuf,
    /// Kernel name (see `strata emu list`).
    pub kernel: String,
    /// Workgroups per dimension, X,Y,Z (like hipModuleLaunchKernel's grid).
    #[arg(long, value_parser = parse_dim3, default_value = "1,1,1")]
    pub grid: [u32; 3],
    /// Work-items per workgroup, X,Y,Z.
    #[arg(long, value_parser = parse_dim3, default_value = "32,1,1")]
    pub block: [u32; 3],
    /// Dynamic LDS bytes (sharedMemBytes).
    #[arg(long, default_value_t = 0)]
    pub lds: u32,
    /// Kernel arguments in order (see above).
    #[arg(long = "arg")]
    pub args: Vec<String>,
    /// Stop a kernel after this many instructions per wave (catches kernels that never end).
    #[arg(long)]
    pub budget: Option<u64>,
    /// Stop the launch once all its waves together have run this many instructions (bounds
    /// the work of a large grid, which the per-wave budget does not).
    #[arg(long, default_value_t = DEFAULT_LAUNCH_BUDGET)]
    pub launch_budget: u64,
    /// Refuse a grid of more waves than this (every wave costs time and memory, however
    /// little it does).
    #[arg(long, default_value_t = DEFAULT_MAX_WAVES)]
    pub max_waves: u64,
}

/// `--launch-budget` default: 10^9 instructions, a minute or two of the software device (about
/// 10 M wave instructions per second per core).
pub const DEFAULT_LAUNCH_BUDGET: u64 = 1_000_000_000;
/// `--max-waves` default: 2^20 waves (33.5 M work-items of wave32).
pub const DEFAULT_MAX_WAVES: u64 = 1 << 20;

fn parse_dim3(s: &str) -> Result<[u32; 3], String> {
    let v: Vec<&str> = s.split(',').collect();
    if v.is_empty() || v.len() > 3 {
        return Err(format!("expected X[,Y[,Z]], got '{s}'"));
    }
    let mut d = [1u32; 3];
    for (i, p) in v.iter().enumerate() {
        d[i] = p.trim().parse().map_err(|_| format!("'{p}' is not a positive integer"))?;
        if d[i] == 0 {
            return Err(format!("dimension {i} of '{s}' is 0"));
        }
    }
    Ok(d)
}

fn read_object(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).with_context(|| format!("reading code object {}", file.display()))
}

pub fn run(args: &EmuArgs) -> Result<()> {
    match &args.command {
        EmuCmd::Disasm { file } => {
            let text = emulator::disassemble(&read_object(file)?)
                .with_context(|| format!("disassembling {}", file.display()))?;
            // llvm-objdump names the file in its header line; so do we.
            let text = text.replacen("<code object>:", &format!("{}:", file.display()), 1);
            write_stdout(&text)
        }
        EmuCmd::List { file } => {
            let dev = Device::new();
            let module = dev.load_module(&read_object(file)?).with_context(|| format!("loading {}", file.display()))?;
            let text: String = module.kernels().iter().map(|k| describe_kernel(k) + "\n").collect();
            write_stdout(&text)
        }
        EmuCmd::Run(r) => run_kernel(r),
    }
}

pub fn describe_kernel(k: &KernelInfo) -> String {
    let mut s = format!(
        "{}: kernarg {} B, LDS {} B, scratch {} B, wave{}, max block {}, VGPRs {}, SGPRs {}\n",
        k.name,
        k.kernarg_size,
        k.group_segment_size,
        k.private_segment_size,
        k.wavefront_size,
        k.max_flat_workgroup_size,
        k.vgpr_count,
        k.sgpr_count
    );
    for a in &k.args {
        let _ = writeln!(s, "    +{:<3} {:>2} B  {}", a.offset, a.size, a.value_kind);
    }
    s
}

/// One `--arg`, resolved against the kernel's declared argument.
enum Arg {
    Buffer { ptr: DevicePtr, bytes: usize, write_back: Option<PathBuf> },
    Null,
    Scalar(Vec<u8>),
}

/// Host memory the buffers of one `emu run` may use (`MemAvailable`; None: unknown).
fn memory_available() -> Option<u64> {
    experts::mem_available()
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Buffer bytes of one run so far, against half the memory available (the rest of the machine
/// keeps the other half): a buffer that cannot fit is an error naming it, not an aborted
/// allocation or the OOM killer.
struct BufferBudget {
    used: u64,
    available: Option<u64>,
}

impl BufferBudget {
    fn take(&mut self, spec: &str, bytes: u64) -> Result<()> {
        let need = self.used.saturating_add(bytes);
        if let Some(avail) = self.available
            && need > avail / 2
        {
            bail!(
                "--arg {spec}: a buffer of {bytes} bytes ({}) does not fit: the buffers of this run would need {}, more than half of the {} of memory available",
                gib(bytes),
                gib(need),
                gib(avail)
            );
        }
        self.used = need;
        Ok(())
    }
}

fn parse_arg(dev: &Device, spec: &str, mem: &mut BufferBudget) -> Result<Arg> {
    if spec == "null" {
        return Ok(Arg::Null);
    }
    let (kind, val) = spec.split_once('=').with_context(|| format!("--arg '{spec}': expected KIND=VALUE"))?;
    // A zeroed device buffer (the device zero-fills), then the file's bytes if any.
    let zeroed = |bytes: usize, write_back: Option<PathBuf>| -> Result<Arg> {
        let ptr = dev.malloc(bytes.max(1)).with_context(|| format!("--arg {spec}"))?;
        Ok(Arg::Buffer { ptr, bytes, write_back })
    };
    let from_file = |file: &str, write_back: bool, mem: &mut BufferBudget| -> Result<Arg> {
        let len = std::fs::metadata(file).with_context(|| format!("--arg {spec}: reading {file}"))?.len();
        mem.take(spec, len)?;
        let data = std::fs::read(file).with_context(|| format!("--arg {spec}: reading {file}"))?;
        let arg = zeroed(data.len(), write_back.then(|| file.into()))?;
        if let Arg::Buffer { ptr, .. } = &arg {
            dev.memcpy_htod(*ptr, &data)?;
        }
        Ok(arg)
    };
    let num = |what: &str| -> Result<i128> {
        val.parse::<i128>().with_context(|| format!("--arg {spec}: '{val}' is not a {what}"))
    };
    let int = |lo: i128, hi: i128, width: usize| -> Result<Arg> {
        let v = num("integer")?;
        if v < lo || v > hi {
            bail!("--arg {spec}: {v} does not fit in {kind}");
        }
        Ok(Arg::Scalar((v as u64).to_le_bytes()[..width].to_vec()))
    };
    let count =
        |n: &str| -> Result<usize> { n.parse().with_context(|| format!("--arg {spec}: '{n}' is not a byte count")) };
    match kind {
        "in" => from_file(val, false, mem),
        "inout" => from_file(val, true, mem),
        "out" => {
            let (file, n) = val.split_once(':').with_context(|| format!("--arg {spec}: expected out=FILE:BYTES"))?;
            let n = count(n)?;
            mem.take(spec, n as u64)?;
            zeroed(n, Some(file.into()))
        }
        "zero" => {
            let n = count(val)?;
            mem.take(spec, n as u64)?;
            zeroed(n, None)
        }
        "u8" => int(0, u8::MAX as i128, 1),
        "u16" => int(0, u16::MAX as i128, 2),
        "u32" => int(0, u32::MAX as i128, 4),
        "i32" => int(i32::MIN as i128, i32::MAX as i128, 4),
        "u64" => int(0, u64::MAX as i128, 8),
        "i64" => int(i64::MIN as i128, i64::MAX as i128, 8),
        "f32" => {
            let x: f32 = val.parse().with_context(|| format!("--arg {spec}: '{val}' is not a number"))?;
            Ok(Arg::Scalar(x.to_le_bytes().to_vec()))
        }
        _ => {
            bail!("--arg {spec}: unknown kind '{kind}' (in, out, inout, zero, null, u8, u16, u32, i32, u64, i64, f32)")
        }
    }
}

fn run_kernel(r: &RunArgs) -> Result<()> {
    let dev = Device::new();
    if let Some(b) = r.budget {
        dev.set_instruction_budget(b);
    }
    dev.set_launch_budget(Some(r.launch_budget));
    // Refused before anything is allocated: the waves of the grid.
    let groups = r.grid.iter().map(|&g| g as u128).product::<u128>();
    let waves = groups * (r.block.iter().map(|&b| b as u128).product::<u128>()).div_ceil(32);
    if waves > r.max_waves as u128 {
        bail!(
            "--grid {} --block {}: {waves} waves ({groups} workgroups), more than --max-waves {} (raise it to run this launch)",
            dims(r.grid),
            dims(r.block),
            r.max_waves
        );
    }
    let module = dev.load_module(&read_object(&r.file)?).with_context(|| format!("loading {}", r.file.display()))?;
    let f = module.function(&r.kernel)?;
    let info = f.info().clone();
    let declared: Vec<_> = info.args.iter().filter(|a| !a.value_kind.starts_with("hidden")).collect();
    if declared.len() != r.args.len() {
        bail!(
            "kernel {} takes {} arguments, {} given:\n{}",
            info.name,
            declared.len(),
            r.args.len(),
            describe_kernel(&info)
        );
    }
    let mut kernargs = vec![0u8; info.kernarg_size as usize];
    let mut args = Vec::new();
    let mut mem = BufferBudget { used: 0, available: memory_available() };
    for (i, (spec, decl)) in r.args.iter().zip(&declared).enumerate() {
        let arg = parse_arg(&dev, spec, &mut mem)?;
        let bytes: Vec<u8> = match &arg {
            Arg::Buffer { ptr, .. } => ptr.to_le_bytes().to_vec(),
            Arg::Null => 0u64.to_le_bytes().to_vec(),
            Arg::Scalar(b) => b.clone(),
        };
        let is_ptr = decl.value_kind == "global_buffer";
        if is_ptr != matches!(arg, Arg::Buffer { .. } | Arg::Null) || bytes.len() != decl.size as usize {
            bail!(
                "argument {i} ('{spec}') does not match the kernel's declaration ({} B {}):\n{}",
                decl.size,
                decl.value_kind,
                describe_kernel(&info)
            );
        }
        let at = decl.offset as usize;
        let seg = kernargs.len();
        kernargs
            .get_mut(at..at + bytes.len())
            .with_context(|| format!("argument {i} at +{at} lies outside the {seg} B kernarg segment"))?
            .copy_from_slice(&bytes);
        args.push(arg);
    }
    let stats = dev.launch(&f, r.grid, r.block, r.lds, &kernargs)?;
    for a in &args {
        if let Arg::Buffer { ptr, bytes, write_back: Some(path) } = a {
            copy_to_file(&dev, *ptr, *bytes, path).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    write_stdout(&format_stats(&info.name, &stats))
}

/// Copies a device buffer to a file in 16 MiB pieces (no second whole copy in host memory).
fn copy_to_file(dev: &Device, ptr: DevicePtr, bytes: usize, path: &Path) -> Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut buf = vec![0u8; bytes.min(16 << 20)];
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(buf.len());
        dev.memcpy_dtoh(&mut buf[..n], ptr + done as u64)?;
        f.write_all(&buf[..n])?;
        done += n;
    }
    f.flush()?;
    Ok(())
}

fn dims(d: [u32; 3]) -> String {
    format!("{},{},{}", d[0], d[1], d[2])
}

/// Writes to stdout; a closed pipe (`strata emu disasm x.elf | head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

pub fn format_stats(kernel: &str, s: &LaunchStats) -> String {
    let mut out = format!(
        "{kernel}: {} waves, {} instructions, {} lane-ops, global read {} B, written {} B, LDS {} B\n",
        s.waves, s.instructions, s.lane_ops, s.global_bytes_read, s.global_bytes_written, s.lds_bytes
    );
    for (fam, n) in &s.by_family {
        let _ = writeln!(out, "    {fam:<8} {n}");
    }
    out
}
