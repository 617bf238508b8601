use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment, in bytes, of every buffer, offset and length handed to the kernel with `O_DIRECT`.
pub const ALIGN: usize = 4096;

/// Rounds `x` up to a multiple of [`ALIGN`].
pub const fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// Rounds `x` down to a multiple of [`ALIGN`].
pub const fn align_down(x: u64) -> u64 {
    x / ALIGN as u64 * ALIGN as u64
}

/// A heap buffer whose address and capacity are multiples of [`ALIGN`] bytes.
///
/// `len` counts the valid bytes (at most the capacity); the bytes past `len` are zero or stale.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively; moving it between threads is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of at least `bytes` capacity (rounded up to [`ALIGN`]), empty.
    pub fn new(bytes: usize) -> Self {
        let cap = (align_up(bytes.max(1) as u64)) as usize;
        let layout = Layout::from_size_align(cap, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    /// Capacity in bytes (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Number of valid bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free space in bytes.
    pub fn remaining(&self) -> usize {
        self.cap - self.len
    }

    /// Sets the number of valid bytes; the caller has written them through [`Self::spare_mut`]
    /// or [`Self::full_mut`].
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "AlignedBuf::set_len({len}) beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends as much of `data` as fits and returns how many bytes were taken.
    pub fn fill_from(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.remaining());
        let len = self.len;
        self.full_mut()[len..len + n].copy_from_slice(&data[..n]);
        self.len += n;
        n
    }

    /// Zero-fills from `len` up to the next multiple of [`ALIGN`] and returns that padded length.
    pub fn pad_to_align(&mut self) -> usize {
        let padded = align_up(self.len as u64) as usize;
        let len = self.len;
        self.full_mut()[len..padded].fill(0);
        padded
    }

    /// The valid bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The valid bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole capacity, mutable (for reads into the buffer).
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes, initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// The first `n` bytes of capacity, whatever `len` is (for writes of padded data).
    pub fn prefix(&self, n: usize) -> &[u8] {
        assert!(n <= self.cap);
        // SAFETY: ptr is valid and initialised for cap >= n bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), n) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).expect("aligned layout");
        // SAFETY: allocated in `new` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("cap", &self.cap)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_and_padding() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.fill_from(&[7u8; 10]), 10);
        assert_eq!(b.pad_to_align(), 4096);
        assert_eq!(&b.prefix(12)[8..], &[7, 7, 0, 0]);
        assert_eq!(b.fill_from(&[1u8; 9000]), 8182);
        assert_eq!(b.remaining(), 0);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_down(8191), 4096);
    }
}
