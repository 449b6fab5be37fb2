//! gguf (placeholder: being written)
