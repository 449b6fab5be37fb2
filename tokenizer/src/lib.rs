//! tokenizer (placeholder: being written)
