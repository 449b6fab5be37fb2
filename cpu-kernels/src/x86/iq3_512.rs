//! placeholder
pub(crate) const READY: bool = false;
use crate::acts::Acts;
use crate::QTensor;
pub(crate) unsafe fn rows_iq3_xxs(_w: &QTensor, _rb: usize, _a: &Acts, _r0: usize, _r1: usize, _y: *mut f32) {}
