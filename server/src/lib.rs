//! server (placeholder: being written)
