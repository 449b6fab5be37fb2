//! TEMPORARY compile stub of the GpuOps contract (replaced by the helper's implementation).
#![allow(unused_variables, dead_code, clippy::too_many_arguments)]
use super::abi::WType;
use super::device::{DevicePtr, GpuApi, Result, Stream};
use std::sync::Arc;
pub struct GpuOps { api: Arc<dyn GpuApi> }
#[derive(Clone, Copy, Debug, PartialEq, Eq)] pub enum GluAct { Silu, GeluTanh }
#[derive(Clone, Copy, Debug, PartialEq, Eq)] pub enum AttnMode { Ordered, Fast }
#[derive(Clone, Copy, Debug, PartialEq, Eq)] pub enum KvFormat { F16, Int8 }
#[derive(Clone, Copy, Debug, PartialEq, Eq)] pub enum RowType { W(WType), F32, F16 }
impl GpuOps {
  pub fn new(api: Arc<dyn GpuApi>) -> Result<GpuOps> { Ok(GpuOps{api}) }
  pub fn api(&self) -> &Arc<dyn GpuApi> { &self.api }
  pub fn quantize_q8_1(&self, s:&Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> { todo!() }
  pub fn quantize_q8_k(&self, s:&Stream, x: DevicePtr, y: DevicePtr, n: u32) -> Result<()> { todo!() }
  pub fn dequant(&self, s:&Stream, ty: WType, f16: bool, w: DevicePtr, y: DevicePtr, nblocks: u32) -> Result<()> { todo!() }
  pub fn mmvq(&self, s:&Stream, ty: WType, ncols: u32, w: DevicePtr, x: DevicePtr, y: DevicePtr, rows: Option<DevicePtr>, nrows: u32, k: u32, y_stride: u32) -> Result<()> { todo!() }
  pub fn rms_norm(&self, s:&Stream, x: DevicePtr, w: DevicePtr, y: DevicePtr, n: u32, n_rows: u32, eps: f32) -> Result<()> { todo!() }
  pub fn rope(&self, s:&Stream, x: DevicePtr, pos: DevicePtr, table: DevicePtr, n_tokens: u32, n_heads: u32, head_dim: u32, rope_dim: u32, neox: bool, fma: bool) -> Result<()> { todo!() }
  pub fn rope_table(freq_base: f32, freq_scale: f32, rope_dim: usize, n_pos: usize) -> Vec<f32> { todo!() }
  pub fn glu(&self, s:&Stream, gate: DevicePtr, up: DevicePtr, out: DevicePtr, n: u32, act: GluAct) -> Result<()> { todo!() }
  pub fn add_rows(&self, s:&Stream, x: DevicePtr, b: DevicePtr, n: u32, n_rows: u32, b_stride: u32) -> Result<()> { todo!() }
  pub fn scale(&self, s:&Stream, x: DevicePtr, n: u32, factor: f32) -> Result<()> { todo!() }
  pub fn softmax(&self, s:&Stream, x: DevicePtr, n: u32, n_rows: u32) -> Result<()> { todo!() }
  pub fn get_rows(&self, s:&Stream, ty: RowType, table: DevicePtr, ids: DevicePtr, n_ids: u32, k: u32, out: DevicePtr, scale: f32) -> Result<()> { todo!() }
  pub fn kv_store(&self, s:&Stream, fmt: KvFormat, src: DevicePtr, cache: DevicePtr, cache_scale: DevicePtr, pos: DevicePtr, n_tokens: u32, n_head_kv: u32, head_dim: u32) -> Result<()> { todo!() }
  pub fn attention(&self, s:&Stream, mode: AttnMode, fmt: KvFormat, q: DevicePtr, k_cache: DevicePtr, k_scale: DevicePtr, v_cache: DevicePtr, v_scale: DevicePtr, out: DevicePtr, pos: DevicePtr, n_tokens: u32, n_head: u32, n_head_kv: u32, head_dim: u32, window: u32, kq_scale: f32) -> Result<()> { todo!() }
  pub fn moe_router(&self, s:&Stream, logits: DevicePtr, ids_out: DevicePtr, w_out: DevicePtr, n_tokens: u32, n_expert: u32, k: u32, renorm: bool) -> Result<()> { todo!() }
  pub fn moe_combine(&self, s:&Stream, y: DevicePtr, map: DevicePtr, w: DevicePtr, out: DevicePtr, d: u32, n_tokens: u32, k: u32) -> Result<()> { todo!() }
}
