//! The staging ring of an expert cache: [`StagingRing::SLOTS`] device slots, each as large as
//! the largest layer's expert, that the misses computed on the device from a copy go through
//! (prompt chunks stream every miss; on the host-readback path a decode window streams its
//! `--pcie-frac` share). Miss `i` goes to slot `i mod SLOTS`, and a copy into a slot waits only
//! for the launches that read the slot's previous expert (an event recorded after them), so the
//! host copies the next experts while the device computes the current one, where a single slot
//! made every copy wait for the stream to drain.
//!
//! The slots are the ring's own, not borrowed from the cache: they cost four experts of VRAM
//! once (the cache holds that many per MoE layer), where borrowing cache slots would cost
//! copying their residents back after every prompt, four experts in each of 48 layers.

use std::sync::Mutex;

use crate::device::{DevicePtr, Event, GpuApi, GpuError, Stream};

pub struct StagingRing {
    base: DevicePtr,
    slot_bytes: usize,
    state: Mutex<RingState>,
}

struct RingState {
    /// The slot the next miss takes.
    next: usize,
    /// Per slot: the event recorded after the launches that read it last (None: never used).
    readers: Vec<Option<Event>>,
}

/// A slot handed out by [`StagingRing::take`]: copy the expert to `base`, launch the products
/// that read it, then [`StagingRing::launched`].
pub struct RingSlot {
    pub base: DevicePtr,
    index: usize,
}

impl StagingRing {
    /// Slots in the ring.
    pub const SLOTS: usize = 4;

    /// Bytes of device memory a ring of slots of `slot_bytes` takes.
    pub fn bytes(slot_bytes: usize) -> usize {
        Self::SLOTS * slot_bytes
    }

    /// A ring over `bytes(slot_bytes)` bytes of device memory at `base` (the caller's).
    pub fn new(base: DevicePtr, slot_bytes: usize) -> StagingRing {
        StagingRing {
            base,
            slot_bytes,
            state: Mutex::new(RingState { next: 0, readers: (0..Self::SLOTS).map(|_| None).collect() }),
        }
    }

    /// The next slot, once the launches that read it last are done.
    pub fn take(&self, api: &dyn GpuApi) -> Result<RingSlot, GpuError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let index = st.next;
        st.next = (index + 1) % Self::SLOTS;
        if let Some(e) = &st.readers[index] {
            api.event_synchronize(e)?;
        }
        Ok(RingSlot { base: self.base + (index * self.slot_bytes) as u64, index })
    }

    /// The launches reading `slot` are queued on `stream`: the slot's next copy waits for them.
    pub fn launched(&self, api: &dyn GpuApi, stream: &Stream, slot: RingSlot) -> Result<(), GpuError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let e = match st.readers[slot.index].take() {
            Some(e) => e,
            None => api.event_create()?,
        };
        api.event_record(&e, stream)?;
        st.readers[slot.index] = Some(e);
        Ok(())
    }

    /// Releases the events (the memory is the caller's).
    pub fn free(&self, api: &dyn GpuApi) -> Result<(), GpuError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.readers.iter_mut().filter_map(Option::take).try_for_each(|e| {
            api.event_synchronize(&e)?;
            api.event_destroy(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_take_the_slots_in_turn_and_a_reused_slot_waits_for_its_readers() {
        let api = crate::device::EmuApi::new().unwrap();
        let st = api.stream_create().unwrap();
        let ring = StagingRing::new(0x1000, 256);
        let mut bases = Vec::new();
        for _ in 0..2 * StagingRing::SLOTS + 1 {
            let slot = ring.take(&api).unwrap();
            bases.push(slot.base);
            ring.launched(&api, &st, slot).unwrap();
        }
        let want: Vec<u64> =
            (0..2 * StagingRing::SLOTS + 1).map(|i| 0x1000 + ((i % StagingRing::SLOTS) * 256) as u64).collect();
        assert_eq!(bases, want);
        // One event per slot, recorded again at each reuse; all released.
        let events = ring.state.lock().unwrap().readers.iter().filter(|e| e.is_some()).count();
        assert_eq!(events, StagingRing::SLOTS);
        ring.free(&api).unwrap();
        assert!(ring.state.lock().unwrap().readers.iter().all(Option::is_none));
    }
}
