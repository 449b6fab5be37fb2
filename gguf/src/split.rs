//! Split models, as written by llama.cpp's `gguf-split`: files named
//! `<prefix>-00001-of-00003.gguf` (1-based in the name), each a complete GGUF file holding a
//! share of the tensors. Metadata comes from the first file; `split.no` (0-based),
//! `split.count` and `split.tensors.count` are cross-checked when present.

use std::path::{Path, PathBuf};

use crate::parse::ParsedFile;
use crate::{GgufError, GgufFile, Shard, Value};

pub(crate) const KEY_NO: &str = "split.no";
pub(crate) const KEY_COUNT: &str = "split.count";
pub(crate) const KEY_TENSORS: &str = "split.tensors.count";

/// `<prefix>-<no:05>-of-<count:05>.gguf` with `no` 1-based, as llama.cpp names shards.
pub fn split_path(prefix: &str, no: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

/// The prefix of a shard path (`dir/name` for `dir/name-00002-of-00003.gguf`), if it is one.
pub fn split_prefix(path: &Path) -> Option<String> {
    parse_split_name(path).map(|(p, _, _)| p)
}

/// Splits a shard path into (prefix, 1-based number, count).
pub(crate) fn parse_split_name(path: &Path) -> Option<(String, u32, u32)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    // "-NNNNN-of-NNNNN" is 15 bytes; the digits are ASCII so byte slicing is safe once checked.
    let tail = stem.get(stem.len().checked_sub(15)?..)?;
    let b = tail.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b[0] != b'-' || &b[6..10] != b"-of-" || !digits(1..6) || !digits(10..15) {
        return None;
    }
    let no: u32 = tail[1..6].parse().ok()?;
    let count: u32 = tail[10..15].parse().ok()?;
    if no == 0 || count == 0 || no > count {
        return None;
    }
    Some((stem[..stem.len() - 15].to_string(), no, count))
}

pub(crate) fn int_key(path: &Path, meta: &[(String, Value)], key: &str) -> Result<Option<u64>, GgufError> {
    match meta.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v.as_u64().map(Some).ok_or_else(|| GgufError::BadValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            offset: 0,
            reason: format!("expected a non-negative integer, found {} {v}", v.type_name()),
        }),
    }
}

pub(crate) fn check_split_keys(parts: &[(Shard, ParsedFile)]) -> Result<(), GgufError> {
    let n = parts.len() as u64;
    let (first, first_parsed) = &parts[0];
    if let Some(count) = int_key(&first.path, &first_parsed.metadata, KEY_COUNT)?
        && count != n
        && !(count == 0 && n == 1)
    {
        let reason = if n == 1 {
            format!("{KEY_COUNT} is {count} but the file name does not follow <prefix>-00001-of-{count:05}.gguf")
        } else {
            format!("{KEY_COUNT} is {count} but {n} shard files were named")
        };
        return Err(GgufError::Split { path: first.path.clone(), reason });
    }
    if n > 1 {
        for (i, (shard, parsed)) in parts.iter().enumerate() {
            if let Some(no) = int_key(&shard.path, &parsed.metadata, KEY_NO)?
                && no != i as u64
            {
                return Err(GgufError::Split {
                    path: shard.path.clone(),
                    reason: format!("{KEY_NO} is {no}, expected {i} (0-based) for shard {} of {n}", i + 1),
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn check_tensor_total(g: &GgufFile) -> Result<(), GgufError> {
    let path = &g.shards[0].path;
    if let Some(total) = int_key(path, &g.metadata, KEY_TENSORS)?
        && total != g.tensors.len() as u64
    {
        return Err(GgufError::Split {
            path: path.clone(),
            reason: format!("{KEY_TENSORS} is {total} but the shards hold {} tensors", g.tensors.len()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = Path::new("/a/b/model-q8-00002-of-00003.gguf");
        assert_eq!(parse_split_name(p), Some(("/a/b/model-q8".to_string(), 2, 3)));
        assert_eq!(split_path("/a/b/model-q8", 1, 3), PathBuf::from("/a/b/model-q8-00001-of-00003.gguf"));
        assert_eq!(parse_split_name(Path::new("model.gguf")), None);
        assert_eq!(parse_split_name(Path::new("m-00004-of-00003.gguf")), None);
        assert_eq!(parse_split_name(Path::new("m-0000x-of-00003.gguf")), None);
        assert_eq!(parse_split_name(Path::new("é-00001-of-00002.gguf")), Some(("é".to_string(), 1, 2)));
        assert_eq!(parse_split_name(Path::new("-00001-of-00002.gguf")), Some((String::new(), 1, 2)));
    }
}
