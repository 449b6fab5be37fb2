//! Where the weights the CPU computes with live: read into RAM at load (the default, when
//! they fit in the available memory; one region in 2 MiB pages, `model::ram`), or left
//! memory-mapped (`--mmap` for every weight, `--mmap-experts` for the routed experts, or when
//! they do not fit), so the page cache and the SSD serve them as they are used. Weights a GPU
//! holds are never copied: only the CPU backend and an expert cache's misses read host copies.

use experts::RAM_HEADROOM;
pub use experts::ram_budget;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use model::Mat;
/// Copies smaller than this show no progress bar.
const BAR_FROM: u64 = 256 << 20;

/// Which weights a placement is about: they have their own flag.
pub use model::loaded::HostWeights as Weights;

fn name(what: Weights) -> &'static str {
    match what {
        Weights::Dense => "weights",
        Weights::Experts => "routed experts",
    }
}

fn flag(what: Weights) -> &'static str {
    match what {
        Weights::Dense => "--mmap",
        Weights::Experts => "--mmap-experts",
    }
}

/// What became of a group of weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Copied into RAM.
    Ram { bytes: u64 },
    /// Left mapped: they did not fit in `budget` bytes.
    TooBig { bytes: u64, budget: u64 },
    /// Left mapped: the memory for the copy could not be allocated.
    NoMemory { bytes: u64, error: String },
}

impl Placement {
    /// Bytes now in RAM.
    pub fn in_ram(&self) -> u64 {
        match *self {
            Placement::Ram { bytes } => bytes,
            _ => 0,
        }
    }

    /// The line to print about `what`, if any (nothing for a small copy).
    pub fn message(&self, what: Weights) -> Option<String> {
        let (name, flag) = (name(what), flag(what));
        match self {
            Placement::Ram { bytes } if *bytes >= BAR_FROM => {
                Some(format!("strata: {name} read into RAM ({})", HumanBytes(*bytes)))
            }
            Placement::Ram { .. } => None,
            Placement::TooBig { bytes, budget } => Some(format!(
                "strata: the {name} ({}) do not fit in the available RAM ({} after {} of headroom): they stay memory-mapped and are read from the file as used (pass {flag} to choose this without the check)",
                HumanBytes(*bytes),
                HumanBytes(*budget),
                HumanBytes(RAM_HEADROOM)
            )),
            Placement::NoMemory { bytes, error } => Some(format!(
                "strata: could not allocate RAM for the {name} ({}: {error}): they stay memory-mapped (pass {flag} to choose this)",
                HumanBytes(*bytes)
            )),
        }
    }
}

/// Reads the mapped matrices among `mats` into RAM if their bytes fit in `budget` (None: no
/// limit), in place; otherwise leaves them mapped. Windows shared by several matrices (a tied
/// output head and token embedding) are copied once.
pub fn read_into_ram(what: Weights, mats: Vec<&mut Mat>, budget: Option<u64>) -> Placement {
    let mapped: Vec<&mut Mat> = mats.into_iter().filter(|m| m.is_mapped()).collect();
    let bytes = Mat::mapped_bytes(&mapped);
    if let Some(budget) = budget.filter(|&b| bytes > b) {
        return Placement::TooBig { bytes, budget };
    }
    let bar = if bytes >= BAR_FROM { ProgressBar::new(bytes) } else { ProgressBar::hidden() };
    let style = format!("reading {} into RAM {{bar:30}} {{binary_bytes}}/{{binary_total_bytes}} ({{eta}})", name(what));
    bar.set_style(ProgressStyle::with_template(&style).unwrap_or_else(|_| ProgressStyle::default_bar()));
    let done = Mat::read_into_ram(mapped, |src| {
        release_pages(src);
        bar.inc(src.len() as u64);
    });
    bar.finish_and_clear();
    match done {
        Ok(()) => Placement::Ram { bytes },
        Err(e) => Placement::NoMemory { bytes, error: e.to_string() },
    }
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
