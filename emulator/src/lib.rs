//! emulator (placeholder: being written)
