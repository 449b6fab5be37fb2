//! Byte-level BPE's pre-tokenizer (step 1 of `bpe`): the regex families of
//! `tokenizer.ggml.pre` and what each name implies besides its regexes, shared by the
//! vocabulary loader (which reads the name) and the BPE encoder (which splits with it).

use std::sync::OnceLock;

use fancy_regex::Regex;

/// The pre-tokenizer families implemented (llama.cpp `LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// Missing or "default" `tokenizer.ggml.pre`.
    Default,
    /// GPT-2's own regex ("gpt-2", "mpt", "olmo", ...).
    Gpt2,
    /// Llama 3 ("llama-bpe", "llama3", "dbrx", "smaug-bpe", ...): digits in groups of up to 3.
    Llama3,
    /// Qwen2 ("qwen2", "stablelm2", ...): single digits, llama3-like words.
    Qwen2,
    /// StarCoder/SmolLM ("smollm", "starcoder", "refact", ...): every digit split off, then GPT-2.
    Starcoder,
}

/// What a `tokenizer.ggml.pre` name implies besides the regexes.
pub(crate) struct PreInfo {
    pub pre: PreTokenizer,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub add_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl PreTokenizer {
    /// Maps `tokenizer.ggml.pre` to a family and llama.cpp's flags for it; `None` if unknown.
    pub(crate) fn from_name(name: &str) -> Option<PreInfo> {
        use PreTokenizer::*;
        let (pre, clean_spaces, ignore_merges, add_bos) = match name {
            "" | "default" => (Default, true, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
                (Llama3, true, true, true)
            }
            "dbrx" | "smaug-bpe" => (Llama3, true, false, false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
            | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => (Gpt2, true, false, false),
            "trillion" | "granite-docling" => (Gpt2, false, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" | "grok-2" => {
                (Qwen2, false, false, false)
            }
            "stablelm2" | "megrez" => (Qwen2, true, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (Starcoder, true, false, false)
            }
            "smollm" | "command-r" => (Starcoder, false, false, false),
            _ => return None,
        };
        Some(PreInfo { pre, clean_spaces, ignore_merges, add_bos })
    }

    fn regexes(self) -> &'static [Regex] {
        static CACHE: OnceLock<[Vec<Regex>; 5]> = OnceLock::new();
        let all = CACHE.get_or_init(|| {
            // These patterns are constants; fancy-regex accepts them (covered by tests).
            let r = |s: &str| Regex::new(s).expect("built-in pre-tokenizer regex");
            [
                vec![r(r"[\p{P}\$\+<=>\^~\|]+"), r(GPT2), r(r"\p{N}+"), r("[0-9][0-9][0-9]")],
                vec![r(GPT2)],
                vec![r(LLAMA3)],
                vec![r(QWEN2)],
                vec![r(r"\p{N}"), r(GPT2)],
            ]
        });
        &all[self as usize]
    }

    /// Splits `text` into words.
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut frags = vec![text];
        for re in self.regexes() {
            let mut next = Vec::with_capacity(frags.len() * 2);
            for f in frags {
                let mut last = 0;
                for m in re.find_iter(f) {
                    // A backtracking-limit error leaves the rest of the fragment whole.
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        next.push(&f[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < f.len() {
                    next.push(&f[last..]);
                }
            }
            frags = next;
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_tokenizer_splits() {
        let s = PreTokenizer::Starcoder.split("The year 1440, books  in\n\nEurope's");
        assert_eq!(
            s,
            vec!["The", " year", " ", "1", "4", "4", "0", ",", " books", " ", " in", "\n", "\n", "Europe", "'s"]
        );
        let q = PreTokenizer::Qwen2.split("Hello world123 it's  ok\n\n");
        assert_eq!(q, vec!["Hello", " world", "1", "2", "3", " it", "'s", " ", " ok", "\n\n"]);
        let l = PreTokenizer::Llama3.split("x=12345;");
        assert_eq!(l, vec!["x", "=", "123", "45", ";"]);
        let g = PreTokenizer::Gpt2.split("Ünïcödé 日本語 🎉!");
        assert_eq!(g, vec!["Ünïcödé", " 日本語", " 🎉!"]);
    }
}
