//! quant (placeholder: being written)
