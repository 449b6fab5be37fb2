//! cpu-kernels (placeholder: being written)
