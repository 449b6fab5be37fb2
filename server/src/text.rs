//! Streaming detokenization: token bytes → UTF-8 text → text with stop strings cut out.
//!
//! Tokens do not end on character boundaries (byte-fallback tokens like `<0xE2>` carry one byte
//! of a 3-byte character), so bytes are buffered until they form complete characters. Stop
//! strings can span tokens too, so text that could be the start of a stop string is held back
//! until it is known not to be one. Both parts are pure and tested without a tokenizer.

/// Turns a byte stream into the longest valid UTF-8 prefix at each step.
#[derive(Default, Debug)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Add bytes; return the text that is complete now. Incomplete trailing sequences (up to 3
    /// bytes) are kept for the next call; invalid bytes become U+FFFD.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` guarantees `good` is valid UTF-8, so this never defaults.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Truncated sequence at the end: may be completed by the next token.
                        None => {
                            rest = bad;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// End of stream: whatever is still buffered, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Holds back text that may be the beginning of a stop string.
#[derive(Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet emitted.
    held: String,
    /// The stop string that ended the text, once one did.
    matched: Option<usize>,
}

/// Result of feeding text to a [`StopMatcher`].
#[derive(Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to send now.
    pub emit: String,
    /// A stop string was found: `emit` ends right before it, generation must end.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    /// The stop string that was found, if one was (Anthropic's `stop_sequence`).
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    pub fn push(&mut self, text: &str) -> StopStep {
        self.held.push_str(text);
        // Earliest stop string occurrence wins (several may match at different places).
        let hit =
            self.stops.iter().enumerate().filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, i))).min();
        if let Some((pos, which)) = hit {
            self.matched = Some(which);
            let emit = self.held[..pos].to_string();
            self.held.clear();
            return StopStep { emit, stopped: true };
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let emit = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        StopStep { emit, stopped: false }
    }

    /// End of generation without a stop string: the held text was not a stop string after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Token ids → text deltas, for one generation.
pub struct Detokenizer<'a> {
    bytes_of: Box<dyn Fn(u32) -> Vec<u8> + Send + 'a>,
    utf8: Utf8Stream,
    stop: StopMatcher,
}

impl<'a> Detokenizer<'a> {
    pub fn new(bytes_of: impl Fn(u32) -> Vec<u8> + Send + 'a, stops: Vec<String>) -> Self {
        Detokenizer { bytes_of: Box::new(bytes_of), utf8: Utf8Stream::default(), stop: StopMatcher::new(stops) }
    }

    pub fn push(&mut self, token: u32) -> StopStep {
        let text = self.utf8.push(&(self.bytes_of)(token));
        self.stop.push(&text)
    }

    /// The stop string that ended the text, if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.stop.matched()
    }

    /// Generation ended (not by a stop string): flush buffered bytes and held text.
    pub fn finish(&mut self) -> StopStep {
        let tail = self.utf8.finish();
        let mut step = self.stop.push(&tail);
        if !step.stopped {
            step.emit.push_str(&self.stop.finish());
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_pushes() {
        let mut u = Utf8Stream::default();
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(u.push(&[b'a', euro[0]]), "a");
        assert_eq!(u.push(&euro[1..2]), "");
        assert_eq!(u.push(&euro[2..]), "€");
        assert_eq!(u.finish(), "");
    }

    #[test]
    fn utf8_invalid_bytes_replaced() {
        let mut u = Utf8Stream::default();
        assert_eq!(u.push(&[0xff, b'x']), "\u{fffd}x");
        assert_eq!(u.push(&[0xe2, 0x82]), "");
        assert_eq!(u.finish(), "\u{fffd}");
    }

    #[test]
    fn stop_string_across_pushes_is_not_emitted() {
        let mut m = StopMatcher::new(vec!["</s>".into()]);
        assert_eq!(m.push("hello <"), StopStep { emit: "hello ".into(), stopped: false });
        assert_eq!(m.push("/"), StopStep { emit: "".into(), stopped: false });
        assert_eq!(m.push("s> more"), StopStep { emit: "".into(), stopped: true });
    }

    #[test]
    fn held_text_released_when_not_a_stop() {
        let mut m = StopMatcher::new(vec!["ab".into()]);
        assert_eq!(m.push("xa").emit, "x");
        assert_eq!(m.push("c").emit, "ac");
        assert_eq!(m.push("a").emit, "");
        assert_eq!(m.finish(), "a");
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_prefixes() {
        let mut m = StopMatcher::new(vec!["zz".into(), "é!".into()]);
        assert_eq!(m.push("1é"), StopStep { emit: "1".into(), stopped: false });
        assert_eq!(m.push("!zz"), StopStep { emit: "".into(), stopped: true });
        assert_eq!(m.matched(), Some("é!"));
    }

    #[test]
    fn detokenizer_with_byte_tokens() {
        let pieces: Vec<Vec<u8>> = vec![b"Hi ".to_vec(), vec![0xf0, 0x9f], vec![0x98, 0x80], b" STOP x".to_vec()];
        let mut d = Detokenizer::new(move |t| pieces[t as usize].clone(), vec!["STOP".into()]);
        assert_eq!(d.push(0).emit, "Hi ");
        assert_eq!(d.push(1).emit, "");
        assert_eq!(d.push(2).emit, "😀");
        let s = d.push(3);
        assert_eq!(s, StopStep { emit: " ".into(), stopped: true });
    }
}
