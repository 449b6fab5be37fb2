//! The [`Block`] trait: the common shape of every `#[repr(C)]` block struct, and the one place
//! where raw bytes are reinterpreted as blocks.

use crate::GgmlType;

/// A quantization block as stored in GGUF files.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs made only of integer fields and arrays of them,
/// with no padding (`size_of::<Self>() == Self::TYPE.type_size()`, asserted per format at
/// compile time), so that every bit pattern is a valid value and the bytes are the file bytes.
pub unsafe trait Block: Copy + Sized + 'static {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Elements per block.
    const QK: usize;
    /// Bytes per block.
    const SIZE: usize = core::mem::size_of::<Self>();

    /// Read a block from the first `SIZE` bytes of `bytes` (any alignment).
    /// `None` if `bytes` is shorter than a block.
    #[inline]
    fn read(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::SIZE {
            return None;
        }
        // SAFETY: `bytes` holds at least size_of::<Self>() readable bytes, read_unaligned
        // has no alignment requirement, and by the trait contract any bit pattern is a valid
        // Self.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    /// The block's bytes (file layout).
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: Self has no padding (trait contract), so all SIZE bytes are initialised;
        // the slice borrows `self` and cannot outlive it.
        unsafe { core::slice::from_raw_parts((self as *const Self).cast::<u8>(), Self::SIZE) }
    }

    /// Write the block into the first `SIZE` bytes of `out`. `false` if `out` is too short.
    #[inline]
    fn write(&self, out: &mut [u8]) -> bool {
        match out.get_mut(..Self::SIZE) {
            Some(dst) => {
                dst.copy_from_slice(self.as_bytes());
                true
            }
            None => false,
        }
    }

    /// View `bytes` as a slice of blocks without copying, if its length is a whole number of
    /// blocks and it is suitably aligned (GGUF tensor data is 32-byte aligned, so rows
    /// usually are). Otherwise `None`: fall back to [`Block::read`] per block.
    #[inline]
    fn slice_from_bytes(bytes: &[u8]) -> Option<&[Self]> {
        if !bytes.len().is_multiple_of(Self::SIZE)
            || !(bytes.as_ptr() as usize).is_multiple_of(core::mem::align_of::<Self>())
        {
            return None;
        }
        // SAFETY: length is a whole number of blocks and the pointer is aligned for Self;
        // any bit pattern is a valid Self (trait contract); lifetime tied to `bytes`.
        Some(unsafe { core::slice::from_raw_parts(bytes.as_ptr().cast::<Self>(), bytes.len() / Self::SIZE) })
    }
}

/// Implements [`Block`] for a block struct and asserts at compile time that its size is
/// ggml's `type_size` (i.e. no padding crept in).
macro_rules! impl_block {
    ($t:ty, $ty:expr, $qk:expr) => {
        // SAFETY: $t is #[repr(C)], integer fields only; the assert below proves no padding.
        unsafe impl $crate::block::Block for $t {
            const TYPE: $crate::GgmlType = $ty;
            const QK: usize = $qk;
        }
        const _: () = assert!(core::mem::size_of::<$t>() == $ty.type_size());
        const _: () = assert!($qk == $ty.block_size());
    };
}
pub(crate) use impl_block;
