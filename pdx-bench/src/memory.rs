//! Page-aligned, pre-faulted anonymous memory for transfer buffers, so page
//! faults do not pollute the measurements.

use std::ptr::NonNull;

/// An anonymous mapping, unmapped on drop.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory; synchronization is the user's business.
unsafe impl Send for Buffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn new(len: usize) -> std::io::Result<Buffer> {
        let len = len.max(1);
        // SAFETY: anonymous private mapping, no file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Buffer { ptr: NonNull::new(p.cast()).expect("mmap returned NULL"), len })
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live and `len` long.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
