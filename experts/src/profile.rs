//! Expert profiles, the STRP v1 format of the C++ engine of the same name (`--expert-profile`,
//! `--expert-profile-save`), little-endian:
//!
//! ```text
//! "STRP"  u32 version = 1  u32 n_layers  u32 n_expert  u32 slots  u32 n_ranked
//! n_ranked × (u16 layer, u16 expert)        descending routing frequency
//! n_layers × n_expert × 4 bytes             f32 frequencies (profiling script)
//!                                            or i32 ranks (the engine's save; -1 = never routed)
//! ```
//!
//! The header does not say which table it carries. Ranks are small integers, while every
//! positive f32 frequency read as an i32 is at least 2^23 (its exponent bits), so a table whose
//! every entry, read as i32, lies in `-1..n_layers*n_expert` is taken as ranks, anything else as
//! frequencies. (An all-zero table reads as ranks 0 and frequencies 0 alike: no information.)
//! Every read is bounds-checked; errors name the file and the byte offset.

use std::path::{Path, PathBuf};

/// The per-expert table of a profile.
#[derive(Clone, Debug, PartialEq)]
pub enum Table {
    /// Routing frequency of every (layer, expert), row-major by layer.
    Frequency(Vec<f32>),
    /// Rank of every (layer, expert) in the ranked list; -1 = not ranked.
    Rank(Vec<i32>),
}

/// An expert profile (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub n_layers: u32,
    pub n_expert: u32,
    /// Cache slots the profile was made for (informational).
    pub slots: u32,
    /// (layer, expert), most routed first: the order in which a cache is filled.
    pub ranked: Vec<(u16, u16)>,
    pub table: Table,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: at byte {offset}: {why}")]
    Format { path: PathBuf, offset: usize, why: String },
    #[error(
        "{path}: the profile is for {got_layers} MoE layers x {got_expert} experts, the model has {want_layers} x {want_expert}"
    )]
    ModelMismatch { path: PathBuf, got_layers: u32, got_expert: u32, want_layers: u32, want_expert: u32 },
    #[error("profile: {0}")]
    Invalid(String),
}

const MAGIC: &[u8; 4] = b"STRP";
const HEADER: usize = 24;

struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn err(&self, offset: usize, why: impl Into<String>) -> ProfileError {
        ProfileError::Format { path: self.path.to_path_buf(), offset, why: why.into() }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], ProfileError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            self.err(self.at, format!("truncated: {what} needs {n} bytes, {} left", self.bytes.len() - self.at))
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32, ProfileError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u16(&mut self, what: &str) -> Result<u16, ProfileError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }
}

impl Profile {
    /// Reads a profile file.
    pub fn read(path: &Path) -> Result<Profile, ProfileError> {
        let bytes = std::fs::read(path).map_err(|source| ProfileError::Io { path: path.to_path_buf(), source })?;
        Self::parse(path, &bytes)
    }

    /// Parses profile bytes (`path` is only used in messages).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Profile, ProfileError> {
        let mut r = Reader { path, bytes, at: 0 };
        let magic = r.take(4, "the magic")?.to_vec();
        if magic != MAGIC {
            return Err(r.err(0, format!("not an STRP profile (magic {magic:02x?}, expected \"STRP\")")));
        }
        let version = r.u32("the version")?;
        if version != 1 {
            return Err(r.err(4, format!("version {version}, only 1 is known")));
        }
        let n_layers = r.u32("n_layers")?;
        let n_expert = r.u32("n_expert")?;
        let slots = r.u32("slots")?;
        let n_ranked = r.u32("n_ranked")?;
        let cells = (n_layers as u64) * (n_expert as u64);
        if n_layers > u16::MAX as u32 + 1 || n_expert > u16::MAX as u32 + 1 {
            return Err(
                r.err(8, format!("{n_layers} layers x {n_expert} experts do not fit the u16 ids of the ranked list"))
            );
        }
        if n_ranked as u64 > cells {
            return Err(r.err(20, format!("n_ranked {n_ranked} exceeds n_layers x n_expert = {cells}")));
        }
        let expected = HEADER as u64 + 4 * n_ranked as u64 + 4 * cells;
        if bytes.len() as u64 != expected {
            let why = if (bytes.len() as u64) < expected { "truncated" } else { "trailing bytes" };
            return Err(r.err(
                bytes.len().min(expected as usize),
                format!("{why}: the header announces {expected} bytes, the file has {}", bytes.len()),
            ));
        }
        let mut seen = vec![false; cells as usize];
        let mut ranked = Vec::with_capacity(n_ranked as usize);
        for i in 0..n_ranked as usize {
            let at = r.at;
            let (layer, expert) = (r.u16("a ranked layer")?, r.u16("a ranked expert")?);
            if layer as u32 >= n_layers || expert as u32 >= n_expert {
                return Err(r.err(
                    at,
                    format!("ranked entry {i}: (layer {layer}, expert {expert}) outside {n_layers} x {n_expert}"),
                ));
            }
            let cell = layer as usize * n_expert as usize + expert as usize;
            if std::mem::replace(&mut seen[cell], true) {
                return Err(r.err(at, format!("ranked entry {i}: (layer {layer}, expert {expert}) listed twice")));
            }
            ranked.push((layer, expert));
        }
        let raw: Vec<[u8; 4]> = (0..cells)
            .map(|_| r.take(4, "the table").map(|b| b.try_into().expect("4 bytes")))
            .collect::<Result<_, _>>()?;
        let as_rank: Vec<i32> = raw.iter().map(|b| i32::from_le_bytes(*b)).collect();
        let table = if as_rank.iter().all(|&v| v >= -1 && (v as i64) < cells as i64) {
            Table::Rank(as_rank)
        } else {
            Table::Frequency(raw.iter().map(|b| f32::from_le_bytes(*b)).collect())
        };
        Ok(Profile { n_layers, n_expert, slots, ranked, table })
    }

    /// The profile of a run: `counts[layer][expert]` = times routed. Experts never routed are
    /// not ranked; ties rank the lower (layer, expert) first. The table holds ranks.
    pub fn from_counts(counts: &[Vec<u64>], slots: u32) -> Result<Profile, ProfileError> {
        let n_expert = counts.first().map_or(0, |c| c.len());
        if counts.iter().any(|c| c.len() != n_expert) {
            return Err(ProfileError::Invalid("every layer must count the same number of experts".into()));
        }
        if counts.len() > u16::MAX as usize + 1 || n_expert > u16::MAX as usize + 1 {
            return Err(ProfileError::Invalid(format!(
                "{} layers x {n_expert} experts do not fit u16 ids",
                counts.len()
            )));
        }
        let mut cells: Vec<(u64, u16, u16)> = Vec::new();
        for (l, c) in counts.iter().enumerate() {
            for (e, &n) in c.iter().enumerate() {
                if n > 0 {
                    cells.push((n, l as u16, e as u16));
                }
            }
        }
        cells.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let mut rank = vec![-1i32; counts.len() * n_expert];
        for (i, &(_, l, e)) in cells.iter().enumerate() {
            rank[l as usize * n_expert + e as usize] = i as i32;
        }
        Ok(Profile {
            n_layers: counts.len() as u32,
            n_expert: n_expert as u32,
            slots,
            ranked: cells.iter().map(|&(_, l, e)| (l, e)).collect(),
            table: Table::Rank(rank),
        })
    }

    /// The file bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 4 * self.ranked.len() + 4 * (self.n_layers * self.n_expert) as usize);
        out.extend_from_slice(MAGIC);
        for v in [1, self.n_layers, self.n_expert, self.slots, self.ranked.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for &(l, e) in &self.ranked {
            out.extend_from_slice(&l.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        match &self.table {
            Table::Frequency(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Table::Rank(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
        out
    }

    /// Writes the file (through a temporary file renamed into place, so a crash never leaves a
    /// half-written profile).
    pub fn write(&self, path: &Path) -> Result<(), ProfileError> {
        let io = |source| ProfileError::Io { path: path.to_path_buf(), source };
        let tmp = path.with_extension(format!("partial-{}", std::process::id()));
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Refuses a profile made for another model shape.
    pub fn check_model(&self, path: &Path, n_layers: usize, n_expert: usize) -> Result<(), ProfileError> {
        if self.n_layers as usize != n_layers || self.n_expert as usize != n_expert {
            return Err(ProfileError::ModelMismatch {
                path: path.to_path_buf(),
                got_layers: self.n_layers,
                got_expert: self.n_expert,
                want_layers: n_layers as u32,
                want_expert: n_expert as u32,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("t.strp")
    }

    /// A profile written by hand, byte by byte, from the format description.
    fn handmade(table: &[[u8; 4]]) -> Vec<u8> {
        let mut b = b"STRP".to_vec();
        for v in [1u32, 2, 3, 4, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[1, 0, 2, 0, 0, 0, 0, 0]); // (1, 2), (0, 0)
        for t in table {
            b.extend_from_slice(t);
        }
        b
    }

    #[test]
    fn reads_both_tables_of_a_handmade_file() {
        let freqs: Vec<[u8; 4]> = [0.5f32, 0.0, 0.0, 0.0, 0.0, 0.75].iter().map(|x| x.to_le_bytes()).collect();
        let got = Profile::parse(p(), &handmade(&freqs)).unwrap();
        assert_eq!((got.n_layers, got.n_expert, got.slots), (2, 3, 4));
        assert_eq!(got.ranked, vec![(1, 2), (0, 0)]);
        assert_eq!(got.table, Table::Frequency(vec![0.5, 0.0, 0.0, 0.0, 0.0, 0.75]));
        let ranks: Vec<[u8; 4]> = [1i32, -1, -1, -1, -1, 0].iter().map(|x| x.to_le_bytes()).collect();
        let got = Profile::parse(p(), &handmade(&ranks)).unwrap();
        assert_eq!(got.table, Table::Rank(vec![1, -1, -1, -1, -1, 0]));
        assert_eq!(Profile::parse(p(), &got.to_bytes()).unwrap(), got, "round trip");
    }

    #[test]
    fn from_counts_ranks_by_frequency_then_id() {
        let prof = Profile::from_counts(&[vec![5, 0, 7], vec![7, 1, 0]], 2).unwrap();
        assert_eq!(prof.ranked, vec![(0, 2), (1, 0), (0, 0), (1, 1)]);
        assert_eq!(prof.table, Table::Rank(vec![2, -1, 0, 1, 3, -1]));
        assert_eq!(Profile::parse(p(), &prof.to_bytes()).unwrap(), prof);
    }

    #[test]
    fn bad_files_name_the_offset() {
        let good = handmade(&[[0; 4]; 6]);
        let msg = |b: &[u8]| Profile::parse(p(), b).unwrap_err().to_string();
        assert!(msg(b"GGUF").contains("not an STRP profile"));
        assert!(msg(&good[..10]).contains("at byte 8: truncated"));
        assert!(msg(&good[..good.len() - 1]).contains("truncated: the header announces 56 bytes, the file has 55"));
        let mut long = good.clone();
        long.push(0);
        assert!(msg(&long).contains("trailing bytes"));
        let mut v2 = good.clone();
        v2[4] = 2;
        assert!(msg(&v2).contains("at byte 4: version 2"));
        let mut out_of_range = good.clone();
        out_of_range[24] = 9; // layer 9 of 2
        assert!(msg(&out_of_range).contains("at byte 24: ranked entry 0: (layer 9, expert 2) outside 2 x 3"));
        let mut dup = good.clone();
        dup[28..32].copy_from_slice(&[1, 0, 2, 0]);
        assert!(msg(&dup).contains("at byte 28: ranked entry 1: (layer 1, expert 2) listed twice"));
        let mut many = good.clone();
        many[20..24].copy_from_slice(&7u32.to_le_bytes());
        assert!(msg(&many).contains("n_ranked 7 exceeds"));
        let prof = Profile::parse(p(), &good).unwrap();
        assert!(prof.check_model(p(), 2, 3).is_ok());
        assert!(
            prof.check_model(p(), 48, 512)
                .unwrap_err()
                .to_string()
                .contains("2 MoE layers x 3 experts, the model has 48 x 512")
        );
    }
}
