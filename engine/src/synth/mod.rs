//! Writers of synthetic (random-weight) model files for tests, benchmarks and demos, kept out
//! of the model descriptions they exercise. The shared-decoder fixtures are written by
//! `scripts/make-testdata.sh` (Python, with the `gguf` package, byte-identical to the files
//! llama.cpp's references were recorded on); Flash-Next's by [`qwen4exp`] (`strata synth`).

pub mod qwen4exp;
