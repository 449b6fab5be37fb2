//! Tokenizers built from GGUF metadata, matching llama.cpp token for token.
//!
//! * `tokenizer.ggml.model = "llama"`: SentencePiece BPE (Gemma, Llama 2): spaces become "▁",
//!   pairs merge by token score, unknown bytes fall back to `<0xNN>` tokens ([`spm`]).
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merge ranks and a regex pre-tokenizer
//!   chosen by `tokenizer.ggml.pre` (qwen2, llama3/llama-bpe, smollm/starcoder, gpt-2, default)
//!   ([`bpe`]).
//!
//! Special tokens are cut out of the text first ([`special`]); the end-of-generation set and
//! special ids are derived as llama.cpp does ([`vocab`]); chat templates are in [`chat`].

mod bpe;
mod chat;
mod pretok;
mod special;
mod spm;
mod vocab;

pub use pretok::PreTokenizer;

use chat::ChatTemplate;
use special::Frag;
use vocab::{Model, Vocab, attr};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("tokenizer metadata {key:?}: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("unsupported {0}")]
    Unsupported(String),
    #[error("no chat template: the model stores none and architecture {arch:?} has no built-in one")]
    NoChatTemplate { arch: String },
    /// The template could not be rendered (a syntax error, a runaway loop, ...): the model's
    /// fault, not the conversation's.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The template itself refused the conversation (`raise_exception`, e.g. "Conversation
    /// roles must alternate user/assistant"): the conversation's fault.
    #[error("chat template: the template refuses this conversation: {0}")]
    ChatTemplateRaised(String),
}

/// One chat turn; `role` is "system", "user" or "assistant" (templates may accept others).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: content.to_string() }
    }
}

pub struct Tokenizer {
    v: Vocab,
    /// Bytes of every token as llama.cpp's `token_to_piece(special = true)` gives them.
    pieces: Vec<Vec<u8>>,
    chat: Option<ChatTemplate>,
    arch: String,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name())
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .field("add_bos", &self.add_bos())
            .field("eog", &self.v.eog)
            .field("chat_template", &self.chat.as_ref().map(ChatTemplate::name))
            .finish()
    }
}

impl Tokenizer {
    pub fn from_gguf(g: &gguf::GgufFile) -> Result<Tokenizer, TokenizerError> {
        let v = Vocab::load(g)?;
        let pieces = (0..v.n_tokens() as u32).map(|id| piece(&v, id)).collect();
        let arch = g.architecture().unwrap_or("").to_string();
        let stored = g.get("tokenizer.chat_template").and_then(gguf::Value::as_str);
        let chat = ChatTemplate::select(stored, &arch, |t| v.text_to_token(t).is_some());
        Ok(Tokenizer { v, pieces, chat, arch })
    }

    /// Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special = add_bos,
    /// parse_special)`: with `add_bos` the BOS token is prepended **only if the vocabulary asks
    /// for it** ([`add_bos`](Self::add_bos), e.g. Gemma yes, SmolLM/Qwen no), and EOS appended
    /// if it asks for that. With `parse_special`, control tokens written in the text
    /// (`<start_of_turn>`, `<|im_end|>`) become their ids; user-defined tokens always do.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.v;
        let mut out = Vec::new();
        if add_bos && v.add_bos {
            out.extend(v.sp.bos);
        }
        let frags = special::partition(v, text, parse_special);
        match &v.model {
            Model::Spm => {
                // A leading "▁" goes before text that starts the input or follows a special token.
                let mut prev_special = true;
                for f in frags {
                    match f {
                        Frag::Text(t) => {
                            let prefix = if v.add_space_prefix && prev_special { " " } else { "" };
                            let escaped = format!("{prefix}{t}").replace(' ', "\u{2581}");
                            spm::encode(v, &escaped, &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe { pre, ranks } => {
                for f in frags {
                    match f {
                        Frag::Text(t) => bpe::encode(v, *pre, ranks, t, &mut out),
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_bos && v.add_eos {
            out.extend(v.sp.eos);
        }
        out
    }

    /// Text of the concatenated token pieces (special tokens rendered as their text), lossy
    /// UTF-8. Like llama.cpp's detokenize: a SentencePiece vocabulary that adds a space prefix
    /// drops the first token's leading space, and GPT-2-style vocabularies apply llama.cpp's
    /// `clean_spaces` clean-up.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, true)
    }

    /// [`decode`](Self::decode); with `render_special = false` control and unknown tokens are
    /// left out (llama.cpp `special = false`, the default of llama-cpp-python's `detokenize`).
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::new();
        let mut strip_space = self.v.add_space_prefix;
        for &id in ids {
            if !render_special && self.v.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
                strip_space = false;
                continue;
            }
            let p = self.token_bytes(id);
            let p = if strip_space { p.strip_prefix(b" ").unwrap_or(p) } else { p };
            strip_space = false;
            bytes.extend_from_slice(p);
        }
        if self.v.clean_spaces {
            clean_spaces(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes of one token, for streaming: a byte-fallback token is a single byte that
    /// may be part of a multi-byte UTF-8 character, so callers must buffer until the bytes
    /// form valid UTF-8. Empty for ids outside the vocabulary.
    pub fn token_to_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes(id).to_vec()
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn bos(&self) -> Option<u32> {
        self.v.sp.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.v.sp.eos
    }

    /// End-of-turn token (`<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`, ...), if any.
    pub fn eot(&self) -> Option<u32> {
        self.v.sp.eot
    }

    /// Whether the vocabulary wants BOS prepended (`tokenizer.ggml.add_bos_token`, defaults
    /// per model as in llama.cpp).
    pub fn add_bos(&self) -> bool {
        self.v.add_bos
    }

    /// End-of-generation set, derived as llama.cpp does (EOS, EOT, EOM, FIM pad/repo/sep, and
    /// tokens with texts like `<end_of_turn>`, `<|im_end|>`, `</s>`). Gemma 3: {1, 106, 212}.
    pub fn is_eog(&self, id: u32) -> bool {
        self.v.eog.contains(&id)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.v.eog.iter().copied().collect()
    }

    /// Control tokens (including "unused" ones): never produced from plain text.
    pub fn is_control(&self, id: u32) -> bool {
        self.v.attr(id) & attr::CONTROL != 0
    }

    pub fn vocab_size(&self) -> usize {
        self.v.n_tokens()
    }

    /// The stored text of a token (SentencePiece "▁hello", byte-level "Ġhello").
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.v.texts.get(id as usize).map(String::as_str)
    }

    /// Id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.v.text_to_token(text)
    }

    /// "spm" or "bpe".
    pub fn model_name(&self) -> &'static str {
        match self.v.model {
            Model::Spm => "spm",
            Model::Bpe { .. } => "bpe",
        }
    }

    /// "jinja" (stored template), "gemma", "chatml", "llama3", or `None`.
    pub fn chat_template_name(&self) -> Option<&'static str> {
        self.chat.as_ref().map(ChatTemplate::name)
    }

    /// The stored Jinja chat template's source, if the model has one (built-in formats have
    /// none). Lets a caller see which features (tools, tool-call syntax) the template knows.
    pub fn chat_template_source(&self) -> Option<&str> {
        match &self.chat {
            Some(ChatTemplate::Jinja(src)) => Some(src),
            _ => None,
        }
    }

    /// Renders a conversation with tools through the stored Jinja template: `messages` and
    /// `tools` in Hugging Face's chat format (messages with `role`, `content`, `tool_calls`,
    /// `tool_call_id`; tools as `{"type": "function", "function": {...}}`), any `Serialize`
    /// value. Struct fields keep their order in the template (HF renders dicts in insertion
    /// order). Built-in formats cannot render tools: an error.
    pub fn apply_chat_template_with_tools<M, T>(
        &self,
        messages: &M,
        tools: Option<&T>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError>
    where
        M: serde::Serialize + ?Sized,
        T: serde::Serialize + ?Sized,
    {
        let src = match &self.chat {
            Some(ChatTemplate::Jinja(src)) => src,
            Some(t) => {
                return Err(TokenizerError::ChatTemplate(format!(
                    "the built-in {} format has no tool calls",
                    t.name()
                )));
            }
            None => {
                return Err(TokenizerError::NoChatTemplate { arch: self.arch.clone() });
            }
        };
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        let tools = tools.map(minijinja::Value::from_serialize);
        chat::render_jinja(
            src,
            &minijinja::Value::from_serialize(messages),
            tools.as_ref(),
            add_generation_prompt,
            text(self.bos()),
            text(self.eos()),
        )
    }

    /// Renders a conversation with the model's chat template (see [`chat`]). The result is
    /// meant to be encoded with `parse_special = true`. Built-in templates do not emit BOS
    /// (encode adds it); stored Jinja templates may (`bos_token`), as with llama.cpp.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let t = self.chat.as_ref().ok_or_else(|| TokenizerError::NoChatTemplate { arch: self.arch.clone() })?;
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        t.apply(messages, add_generation_prompt, text(self.bos()), text(self.eos()))
    }
}

/// llama.cpp `token_to_piece(special = true)`: special and user-defined tokens as written,
/// normal tokens unescaped ("▁" → space, or GPT-2 byte characters → bytes), byte tokens as
/// their byte, unused/undefined tokens empty.
fn piece(v: &Vocab, id: u32) -> Vec<u8> {
    let a = v.attr(id);
    let text = &v.texts[id as usize];
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match v.model {
            Model::Spm => text.replace('\u{2581}', " ").into_bytes(),
            Model::Bpe { .. } => bpe::decode_byte_level(text),
        };
    }
    if a & attr::BYTE != 0 {
        // "<0xNN>"
        if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
            return vec![b];
        }
    }
    Vec::new()
}

/// llama.cpp's detokenize clean-up for GPT-2-style vocabularies: " ?", " !", " .", " ," lose the
/// space; " ' " becomes "'"; " 's", " 'm", " 're", " 've" lose the space.
fn clean_spaces(t: &mut Vec<u8>) {
    let pass = |t: &mut Vec<u8>, f: &mut dyn FnMut(&mut Vec<u8>, usize, &mut usize) -> bool| {
        let n = t.len();
        let mut total = usize::from(n > 0);
        let mut i = 1;
        while i < n {
            let x = t[i];
            if f(t, i, &mut total) {
                i += 1; // the callback consumed t[i + 1]
            }
            t[total] = x;
            total += 1;
            i += 1;
        }
        t.truncate(total);
    };
    pass(t, &mut |t, i, total| {
        if t[i - 1] == b' ' && matches!(t[i], b'?' | b'!' | b'.' | b',') {
            *total -= 1;
        }
        false
    });
    pass(t, &mut |t, i, total| {
        let n = t.len();
        if t[i] == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            *total -= 1;
            t[i + 1] = 0;
            return true;
        }
        false
    });
    pass(t, &mut |t, i, total| {
        let n = t.len();
        if t[i - 1] == b' ' && t[i] == b'\'' && i + 1 < n {
            let x1 = t[i + 1];
            if matches!(x1, b's' | b'm') || (i + 2 < n && matches!((x1, t[i + 2]), (b'r', b'e') | (b'v', b'e'))) {
                *total -= 1;
            }
        }
        false
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Tokenizer>();
        check::<gguf::GgufFile>();
    }

    #[test]
    fn clean_spaces_passes() {
        let mut b = b"Hello , world ! it 's a ' b ' c 're".to_vec();
        super::clean_spaces(&mut b);
        assert_eq!(String::from_utf8(b).unwrap(), "Hello, world! it's a'b'c're");
    }
}
