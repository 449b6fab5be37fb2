//! Where the routed experts the CPU computes live: read into RAM at load (the default, when
//! they fit in the available memory), or left memory-mapped (`--mmap-experts`, or when they do
//! not fit), so the page cache and the SSD serve them as they are used. Experts the GPU keeps
//! resident in VRAM are never copied: only the CPU backend and an expert cache's misses read
//! the host copies.

use experts::RAM_HEADROOM;
pub use experts::ram_budget;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use model::Mat;
/// Copies smaller than this show no progress bar.
const BAR_FROM: u64 = 256 << 20;

/// What became of a model's routed experts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Copied into RAM.
    Ram { bytes: u64 },
    /// Left mapped: `--mmap-experts`, or (`too_big`) they did not fit in `budget` bytes.
    Mapped { bytes: u64, too_big: Option<u64> },
}

impl Placement {
    /// The line to print about it, if any (nothing for a small copy or the explicit flag).
    pub fn message(&self) -> Option<String> {
        match *self {
            Placement::Ram { bytes } if bytes >= BAR_FROM => Some(format!("strata: routed experts read into RAM ({})", HumanBytes(bytes))),
            Placement::Mapped { bytes, too_big: Some(budget) } => Some(format!(
                "strata: the routed experts ({}) do not fit in the available RAM ({} after {} of headroom): they stay memory-mapped and are read from the file as used (pass --mmap-experts to choose this without the check)",
                HumanBytes(bytes),
                HumanBytes(budget),
                HumanBytes(RAM_HEADROOM)
            )),
            _ => None,
        }
    }
}

/// Reads the mapped matrices among `mats` into RAM if their bytes fit in `budget` (None: no
/// limit), in place; otherwise leaves them mapped.
pub fn read_into_ram(mats: Vec<&mut Mat>, budget: Option<u64>) -> Placement {
    let mapped: Vec<&mut Mat> = mats.into_iter().filter(|m| m.is_mapped()).collect();
    let bytes: u64 = mapped.iter().map(|m| m.data().len() as u64).sum();
    if let Some(budget) = budget.filter(|&b| bytes > b) {
        return Placement::Mapped { bytes, too_big: Some(budget) };
    }
    let bar = if bytes >= BAR_FROM { ProgressBar::new(bytes) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("reading experts into RAM {bar:30} {binary_bytes}/{binary_total_bytes} ({eta})").unwrap_or_else(|_| ProgressStyle::default_bar()));
    for m in mapped {
        let copy = m.to_owned_bytes();
        release_pages(m.data());
        bar.inc(copy.data().len() as u64);
        *m = copy;
    }
    bar.finish_and_clear();
    Placement::Ram { bytes }
}

/// Lets the kernel take back the mapped pages wholly inside `bytes`, just copied: they leave
/// this process's resident set (a later read would fault them in from the file again), so the
/// experts are not counted twice, as the copy and as the mapping it was read through.
fn release_pages(bytes: &[u8]) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let (start, end) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
    let (first, last) = (start.next_multiple_of(page), end / page * page);
    if last > first {
        // SAFETY: whole pages inside the model's read-only shared file mapping, which stays
        // mapped: MADV_DONTNEED only drops them from this process, and any later read faults
        // the same bytes back in from the file.
        unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED) };
    }
}

/// The routed-expert matrices of a shared-decoder model (its MoE stacks).
pub fn decoder_experts(m: &mut model::Model) -> Vec<&mut Mat> {
    m.w.layers
        .iter_mut()
        .flat_map(|l| match &mut l.ffn.ffn {
            model::Ffn::Moe { gate, up, down, .. } => vec![gate, up, down],
            model::Ffn::Dense { .. } => Vec::new(),
        })
        .collect()
}

/// The routed-expert matrices of a Flash-Next model (not its shared experts).
pub fn flash_next_experts(m: &mut model::qwen4exp::Qwen4Exp) -> Vec<&mut Mat> {
    m.layers.iter_mut().flat_map(|l| l.moe.experts.iter_mut().flat_map(|e| [&mut e.gate, &mut e.up, &mut e.down])).collect()
}
