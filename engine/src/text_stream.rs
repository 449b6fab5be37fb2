//! Token bytes to text pieces for streaming output.

/// Turns a stream of token byte strings into valid UTF-8 text pieces, holding back incomplete
/// multi-byte sequences (byte-fallback tokens split characters).
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds bytes; returns the longest complete UTF-8 prefix (invalid bytes become U+FFFD).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("validated prefix"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (lossy).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    #[test]
    fn text_stream_holds_split_characters() {
        let mut t = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(t.push(&e[..1]), "");
        assert_eq!(t.push(&e[1..]), "é");
        assert_eq!(t.push(b"a\xffb"), "a\u{FFFD}b");
    }
}
