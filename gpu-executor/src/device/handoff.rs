//! Mapped-memory handoff between the GPU and host worker threads (the path the CPU computes
//! experts on): a [`Mailbox`] is one pinned, device-mapped buffer holding a 64-bit state word
//! and a payload, usable in both directions and from captured graphs.
//!
//! Protocol (one producer, one consumer, either side): the state word is [`EMPTY`] or
//! [`FULL`]. The producer waits for `EMPTY`, writes the payload, then stores `FULL` (release);
//! the consumer waits for `FULL` (acquire), reads the payload, then stores `EMPTY`. Because the
//! device side waits and writes fixed values (`hipStreamWaitValue64` / `WriteValue64`), the same
//! captured graph can be replayed for every round; a late producer simply makes the stream (or
//! the host thread) wait longer. The payload's meaning (and any round counter inside it) is
//! the caller's.
//!
//! When pinning fails (common on ROCm for large sizes even with free RAM) the mailbox lives in
//! device memory instead and the host side goes through synchronous copies: slower, same
//! protocol; [`Mailbox::fallback`] says why.
use super::error::{GpuError, Result};
use super::{DevicePtr, GpuApi, HostAllocOptions, HostBuf, Stream, WaitCond};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs `device` (launches that may wait on words the host writes) on this thread while `host`
/// runs on a scoped thread named `name` (the host side of a mailbox). When `device` fails, what
/// it enqueued still runs to its end and `cancel` (the host's) is set, so a host waiting for
/// the device gives up. Returns both results, or why the host thread could not run (it did not
/// start, or it panicked).
pub fn alongside<R, E, H: Send>(
    api: &dyn GpuApi,
    st: &Stream,
    name: &str,
    host: impl FnOnce(&AtomicBool) -> H + Send,
    device: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<(std::result::Result<R, E>, H), String> {
    let cancel = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, || host(&cancel))
            .map_err(|e| format!("starting the host thread: {e}"))?;
        let r = device();
        if r.is_err() {
            let _ = api.stream_synchronize(st);
            cancel.store(true, Ordering::Release);
        }
        let h = h.join().map_err(|_| "the host thread panicked".to_string())?;
        Ok((r, h))
    })
}

/// How long a wait (host or software-device stream) may take before it is an error.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(20);
/// State word values.
pub const EMPTY: u64 = 0;
pub const FULL: u64 = 1;
/// Layout: state word at 0, payload at 64 (its own cache line).
pub const STATE_OFFSET: usize = 0;
pub const PAYLOAD_OFFSET: usize = 64;

enum Storage {
    Mapped(HostBuf),
    /// Pageable fallback: the words live in device memory.
    Device(DevicePtr),
}

/// A pinned, device-mapped handoff buffer (see the module docs).
pub struct Mailbox {
    storage: Storage,
    capacity: usize,
    fallback: Option<String>,
}

impl Mailbox {
    /// A mailbox for payloads of up to `capacity` bytes, state `EMPTY`.
    pub fn new(api: &dyn GpuApi, capacity: usize) -> Result<Mailbox> {
        let bytes = PAYLOAD_OFFSET + capacity;
        let buf = api.host_alloc(bytes, HostAllocOptions { mapped: true, allow_pageable_fallback: true })?;
        if buf.device_ptr().is_some() {
            api.host_write(&buf, 0, &vec![0u8; bytes])?;
            return Ok(Mailbox { storage: Storage::Mapped(buf), capacity, fallback: None });
        }
        let why = buf.fallback().unwrap_or("pinned memory is not device-mapped").to_string();
        api.host_free(buf)?;
        let d = api.malloc(bytes)?;
        api.memset(d, 0, bytes)?;
        Ok(Mailbox {
            storage: Storage::Device(d),
            capacity,
            fallback: Some(format!("{why}; mailbox kept in device memory")),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Why the mailbox is not host-mapped, when it is the fallback.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }
    /// Device address of the state word.
    pub fn state_ptr(&self) -> DevicePtr {
        match &self.storage {
            Storage::Mapped(b) => b.device_ptr().unwrap_or(0) + STATE_OFFSET as u64,
            Storage::Device(d) => d + STATE_OFFSET as u64,
        }
    }
    /// Device address of the payload.
    pub fn payload_ptr(&self) -> DevicePtr {
        self.state_ptr() - STATE_OFFSET as u64 + PAYLOAD_OFFSET as u64
    }

    fn check_len(&self, call: &'static str, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(super::error::invalid(call, format!("{len} bytes > mailbox capacity {}", self.capacity)));
        }
        Ok(())
    }

    fn load_state(&self, api: &dyn GpuApi) -> Result<u64> {
        match &self.storage {
            Storage::Mapped(b) => api.host_load_u64(b, STATE_OFFSET),
            Storage::Device(d) => {
                let mut w = [0u8; 8];
                api.memcpy_dtoh(&mut w, d + STATE_OFFSET as u64)?;
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                Ok(u64::from_le_bytes(w))
            }
        }
    }
    fn store_state(&self, api: &dyn GpuApi, v: u64) -> Result<()> {
        match &self.storage {
            Storage::Mapped(b) => api.host_store_u64(b, STATE_OFFSET, v),
            Storage::Device(d) => {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
                api.memcpy_htod(d + STATE_OFFSET as u64, &v.to_le_bytes())
            }
        }
    }
    /// Host thread: polls the state word until it equals `want`, or `cancel` is set (the other
    /// side gave up: an error, not a 20 s wait).
    fn host_wait_state(
        &self,
        api: &dyn GpuApi,
        want: u64,
        call: &'static str,
        cancel: Option<&AtomicBool>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.load_state(api)? == want {
                return Ok(());
            }
            if cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
                return Err(GpuError::Capture(format!("{call}: cancelled while waiting for state {want}")));
            }
            if start.elapsed() > WAIT_TIMEOUT {
                return Err(GpuError::Capture(format!("{call}: mailbox state not {want} after {WAIT_TIMEOUT:?}")));
            }
            spins += 1;
            if spins < 64 { std::hint::spin_loop() } else { std::thread::sleep(Duration::from_micros(20)) }
        }
    }

    /// Host producer: waits for `EMPTY`, writes `payload`, publishes `FULL`.
    pub fn host_send(&self, api: &dyn GpuApi, payload: &[u8]) -> Result<()> {
        self.host_send_until(api, payload, None)
    }

    /// [`Mailbox::host_send`] that gives up when `cancel` is set.
    pub fn host_send_until(&self, api: &dyn GpuApi, payload: &[u8], cancel: Option<&AtomicBool>) -> Result<()> {
        self.check_len("Mailbox::host_send", payload.len())?;
        self.host_wait_state(api, EMPTY, "Mailbox::host_send", cancel)?;
        match &self.storage {
            Storage::Mapped(b) => api.host_write(b, PAYLOAD_OFFSET, payload)?,
            Storage::Device(d) => api.memcpy_htod(d + PAYLOAD_OFFSET as u64, payload)?,
        }
        self.store_state(api, FULL)
    }

    /// Host consumer: waits for `FULL`, reads `len` payload bytes, releases with `EMPTY`.
    pub fn host_recv(&self, api: &dyn GpuApi, len: usize) -> Result<Vec<u8>> {
        self.host_recv_until(api, len, None)
    }

    /// [`Mailbox::host_recv`] that gives up when `cancel` is set.
    pub fn host_recv_until(&self, api: &dyn GpuApi, len: usize, cancel: Option<&AtomicBool>) -> Result<Vec<u8>> {
        self.check_len("Mailbox::host_recv", len)?;
        self.host_wait_state(api, FULL, "Mailbox::host_recv", cancel)?;
        let mut out = vec![0u8; len];
        match &self.storage {
            Storage::Mapped(b) => api.host_read(b, PAYLOAD_OFFSET, &mut out)?,
            Storage::Device(d) => api.memcpy_dtoh(&mut out, d + PAYLOAD_OFFSET as u64)?,
        }
        self.store_state(api, EMPTY)?;
        Ok(out)
    }

    /// Back to `EMPTY` after a round that did not finish (a failed window): the next round
    /// starts clean. Only when neither side is using the mailbox.
    pub fn reset(&self, api: &dyn GpuApi) -> Result<()> {
        self.store_state(api, EMPTY)
    }

    /// Device consumer, in `stream` order (capturable): wait for `FULL`, copy `len` payload
    /// bytes to `dst`, then mark `EMPTY`.
    pub fn device_recv(&self, api: &dyn GpuApi, stream: &Stream, dst: DevicePtr, len: usize) -> Result<()> {
        self.device_recv_parts(api, stream, &[(0, dst, len)])
    }

    /// [`Mailbox::device_recv`] into several device ranges, each `(payload offset, dst, len)`.
    pub fn device_recv_parts(
        &self,
        api: &dyn GpuApi,
        stream: &Stream,
        parts: &[(usize, DevicePtr, usize)],
    ) -> Result<()> {
        for &(off, _, len) in parts {
            self.check_len("Mailbox::device_recv", off + len)?;
        }
        api.stream_wait_value64(stream, self.state_ptr(), FULL, WaitCond::Eq)?;
        for &(off, dst, len) in parts {
            api.memcpy_dtod_async(stream, dst, self.payload_ptr() + off as u64, len)?;
        }
        api.stream_write_value64(stream, self.state_ptr(), EMPTY)
    }

    /// Device producer, in `stream` order (capturable): wait for `EMPTY`, copy `len` bytes from
    /// `src` into the payload, then mark `FULL`.
    pub fn device_send(&self, api: &dyn GpuApi, stream: &Stream, src: DevicePtr, len: usize) -> Result<()> {
        self.device_send_parts(api, stream, &[(0, src, len)])
    }

    /// [`Mailbox::device_send`] of several device ranges, each `(payload offset, src, len)`.
    pub fn device_send_parts(
        &self,
        api: &dyn GpuApi,
        stream: &Stream,
        parts: &[(usize, DevicePtr, usize)],
    ) -> Result<()> {
        for &(off, _, len) in parts {
            self.check_len("Mailbox::device_send", off + len)?;
        }
        api.stream_wait_value64(stream, self.state_ptr(), EMPTY, WaitCond::Eq)?;
        for &(off, src, len) in parts {
            api.memcpy_dtod_async(stream, self.payload_ptr() + off as u64, src, len)?;
        }
        api.stream_write_value64(stream, self.state_ptr(), FULL)
    }

    /// Releases the memory (after the device is done with it).
    pub fn free(self, api: &dyn GpuApi) -> Result<()> {
        match self.storage {
            Storage::Mapped(b) => api.host_free(b),
            Storage::Device(d) => api.free(d),
        }
    }
}
