//! Adaptive residency's copies on a side stream (`--adapt-every`, docs/expert-tiering.md): the
//! experts a window's end gives a slot ([`ExpertCache::end_window`]) are copied while the next
//! window runs, on a stream of their own that starts after everything the ending window queued
//! (which may still read the slots' old occupants), and they enter the slot table only once
//! the copies have landed ([`ExpertCache::land`]); until then the CPU computes them.

use crate::device::{DevicePtr, Event, GpuApi, GpuError, HostAllocOptions, HostBuf, Stream};
use crate::experts::cache::{ExpertCache, Swap};

type Result<T> = std::result::Result<T, GpuError>;

pub struct SwapCopies {
    side: Stream,
    /// Recorded on the compute stream at a window's end; the side stream waits for it.
    window_done: Event,
    /// Recorded on the side stream after the copies.
    landed: Event,
    /// Pinned bytes the copies read from (grown to the largest batch).
    staging: Option<HostBuf>,
    in_flight: Vec<Swap>,
}

impl SwapCopies {
    pub fn new(api: &dyn GpuApi) -> Result<SwapCopies> {
        Ok(SwapCopies {
            side: api.stream_create()?,
            window_done: api.event_create()?,
            landed: api.event_create()?,
            staging: None,
            in_flight: Vec::new(),
        })
    }

    /// Admits the swaps whose copies the previous [`SwapCopies::start`] began: waits for them
    /// (they had a whole window to land) and enters their slots into `cache`'s table.
    pub fn land(&mut self, api: &dyn GpuApi, cache: &ExpertCache) -> Result<()> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        api.event_synchronize(&self.landed)?;
        cache.land(&std::mem::take(&mut self.in_flight));
        Ok(())
    }

    /// Starts the copies of `swaps`: `parts` are their (device destination, bytes) pieces. They
    /// run on the side stream after the work queued on `main` so far. Call [`SwapCopies::land`]
    /// first: the staging buffer is reused.
    pub fn start(
        &mut self,
        api: &dyn GpuApi,
        main: &Stream,
        swaps: Vec<Swap>,
        parts: &[(DevicePtr, &[u8])],
    ) -> Result<()> {
        if swaps.is_empty() {
            return Ok(());
        }
        debug_assert!(self.in_flight.is_empty(), "start before the last copies landed");
        let total: usize = parts.iter().map(|p| p.1.len()).sum();
        if self.staging.as_ref().is_none_or(|s| s.len() < total) {
            if let Some(old) = self.staging.take() {
                api.host_free(old)?;
            }
            self.staging =
                Some(api.host_alloc(total, HostAllocOptions { mapped: false, allow_pageable_fallback: true })?);
        }
        let staging = self.staging.as_ref().expect("allocated above");
        api.event_record(&self.window_done, main)?;
        api.stream_wait_event(&self.side, &self.window_done)?;
        let mut at = 0;
        for (dst, bytes) in parts {
            api.host_write(staging, at, bytes)?;
            api.memcpy_htod_async(&self.side, *dst, staging, at, bytes.len())?;
            at += bytes.len();
        }
        api.event_record(&self.landed, &self.side)?;
        self.in_flight = swaps;
        Ok(())
    }

    /// Waits for copies still on their way and releases the stream, events and staging.
    pub fn free(self, api: &dyn GpuApi) -> Result<()> {
        api.stream_synchronize(&self.side)?;
        if let Some(s) = self.staging {
            api.host_free(s)?;
        }
        api.event_destroy(self.window_done)?;
        api.event_destroy(self.landed)?;
        api.stream_destroy(self.side)
    }
}
