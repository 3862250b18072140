//! Page-aligned, pre-faulted anonymous memory for transfer buffers, so page
//! faults do not pollute the measurements.

use memmap2::{MmapMut, MmapOptions};

/// An anonymous mapping (populated up front), unmapped on drop.
pub struct Buffer {
    map: MmapMut,
}

impl Buffer {
    pub fn new(len: usize) -> std::io::Result<Buffer> {
        Ok(Buffer { map: MmapOptions::new().len(len.max(1)).populate().map_anon()? })
    }

    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
    }
}
