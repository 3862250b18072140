//! Device (CUDA) buffers for `--location cuda:N` / `--remote-location`:
//! pdx's [`pdx::device::DeviceBuffer`], allocated through the driver pdx
//! loads (`PDX_CUDA_LIB`: the real driver, or the test stand-in), filled and
//! read back with the driver's copies, so the bench never touches device
//! memory with the CPU either. Errors come back as text.

/// Device memory on one device, freed on drop.
pub struct DeviceBuffer(pdx::device::DeviceBuffer);

/// The ordinal of a `cuda:N` location, `None` for host locations.
pub fn ordinal(location: &str) -> Result<Option<u32>, String> {
    match pdx::transfer::location::Requested::parse(location).map_err(|e| e.to_string())? {
        pdx::transfer::location::Requested::At(l) => Ok(l.cuda_ordinal()),
        pdx::transfer::location::Requested::Detect => Ok(None),
    }
}

impl DeviceBuffer {
    pub fn new(ordinal: u32, len: usize) -> Result<DeviceBuffer, String> {
        pdx::device::DeviceBuffer::new(ordinal, len).map(DeviceBuffer).map_err(|e| e.to_string())
    }

    pub fn addr(&self) -> u64 {
        self.0.addr()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Copy `src` to device offset `off`.
    pub fn upload(&self, off: usize, src: &[u8]) -> Result<(), String> {
        self.0.upload(off, src).map_err(|e| e.to_string())
    }

    /// Copy device offset `off` into `dst`.
    pub fn download(&self, off: usize, dst: &mut [u8]) -> Result<(), String> {
        self.0.download(off, dst).map_err(|e| e.to_string())
    }
}
