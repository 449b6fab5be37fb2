//! Token ids given as such, to `logits`, `generate` and `perplexity`: `--tokens 2,818,5279` on
//! the command line, or `--tokens-file FILE` for sequences longer than an argument list can
//! carry (a 49K-token prompt is ~300 KB of digits; Linux caps one argument at 128 KiB).
//!
//! The file holds decimal ids separated by commas and/or whitespace (newlines included), so
//! `tr ' ' ','`, one id a line, or a JSON array (`[2, 818, 5279]`: its brackets are skipped)
//! all read the same. Anything else is an error naming the file and the byte offset.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;

#[derive(Args, Debug, Clone, Default)]
pub struct TokenIdsArgs {
    /// Token ids, comma-separated, e.g. `2,818,5279` (used as given: no BOS added).
    #[arg(long, value_delimiter = ',', conflicts_with = "tokens_file")]
    pub tokens: Vec<u32>,
    /// Token ids read from FILE: decimal ids separated by commas, spaces or newlines (a JSON
    /// array too). For prompts longer than a command line can hold.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
}

impl TokenIdsArgs {
    /// Whether ids were given at all (either flag).
    pub fn given(&self) -> bool {
        !self.tokens.is_empty() || self.tokens_file.is_some()
    }

    /// The ids given, each checked against a vocabulary of `n_vocab`; None when neither flag
    /// was. A file that holds no id is an error.
    pub fn read(&self, n_vocab: usize) -> Result<Option<Vec<u32>>> {
        let ids = match &self.tokens_file {
            Some(path) => {
                let ids = read_token_file(path, n_vocab)?;
                if ids.is_empty() {
                    bail!("{}: no token ids in the file", path.display());
                }
                ids
            }
            None if self.tokens.is_empty() => return Ok(None),
            None => {
                if let Some((i, &t)) = self.tokens.iter().enumerate().find(|&(_, &t)| t as usize >= n_vocab) {
                    bail!("--tokens: id {t} (number {}) is outside the vocabulary of {n_vocab}", i + 1);
                }
                self.tokens.clone()
            }
        };
        Ok(Some(ids))
    }
}

/// Reads a token-id file (module doc), checking each id against `n_vocab`.
pub fn read_token_file(path: &Path, n_vocab: usize) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading token ids from {}", path.display()))?;
    parse_token_ids(&bytes, n_vocab).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses decimal ids separated by commas and/or ASCII whitespace, skipping the brackets of a
/// JSON array; errors name the byte offset.
pub fn parse_token_ids(bytes: &[u8], n_vocab: usize) -> std::result::Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    let mut at = 0;
    // Whether an id has ended since the last comma: two commas in a row are an empty id.
    let mut after_id = false;
    while at < bytes.len() {
        let b = bytes[at];
        match b {
            b'0'..=b'9' => {
                let start = at;
                while at < bytes.len() && bytes[at].is_ascii_digit() {
                    at += 1;
                }
                let digits = std::str::from_utf8(&bytes[start..at]).expect("ASCII digits");
                let id =
                    digits.parse::<u32>().ok().filter(|&id| (id as usize) < n_vocab).ok_or_else(|| {
                        format!("byte {start}: token id {digits} is outside the vocabulary of {n_vocab}")
                    })?;
                if at < bytes.len() && !matches!(bytes[at], b',' | b']' | b'[') && !bytes[at].is_ascii_whitespace() {
                    return Err(format!("byte {at}: {} after token id {digits}", describe(bytes, at)));
                }
                ids.push(id);
                after_id = true;
            }
            b',' => {
                if !after_id {
                    return Err(format!("byte {at}: a comma with no token id before it"));
                }
                after_id = false;
                at += 1;
            }
            b'[' | b']' => at += 1,
            _ if b.is_ascii_whitespace() => at += 1,
            _ => return Err(format!("byte {at}: {} where a token id was expected", describe(bytes, at))),
        }
    }
    Ok(ids)
}

/// The byte at `at` as an error shows it: the character when printable ASCII, else its value.
fn describe(bytes: &[u8], at: usize) -> String {
    match bytes[at] {
        b @ 0x21..=0x7e => format!("'{}'", b as char),
        b => format!("byte 0x{b:02x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_token_ids;

    #[test]
    fn separators_of_every_common_form_read_the_same_ids() {
        let want = vec![2, 818, 5279, 0];
        for text in ["2,818,5279,0", "2 818 5279 0\n", "2\n818\n5279\n0\n", "[2, 818, 5279, 0]", "2,\r\n818,\t5279, 0,"]
        {
            assert_eq!(parse_token_ids(text.as_bytes(), 6000).unwrap(), want, "{text:?}");
        }
        assert_eq!(parse_token_ids(b"", 10).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn malformed_ids_name_their_byte_offset() {
        let cases: [(&[u8], &str); 6] = [
            (b"1,2,x", "byte 4: 'x' where a token id was expected"),
            (b"1,-2", "byte 2: '-' where a token id was expected"),
            (b"1,,2", "byte 2: a comma with no token id before it"),
            (b"12a", "byte 2: 'a' after token id 12"),
            (b"1,99999999999", "byte 2: token id 99999999999 is outside the vocabulary of 100"),
            (b"5\x00", "byte 1: byte 0x00 after token id 5"),
        ];
        for (input, want) in cases {
            assert_eq!(parse_token_ids(input, 100).unwrap_err(), want, "{:?}", String::from_utf8_lossy(input));
        }
        assert_eq!(
            parse_token_ids(b"3 100", 100).unwrap_err(),
            "byte 2: token id 100 is outside the vocabulary of 100"
        );
    }
}
