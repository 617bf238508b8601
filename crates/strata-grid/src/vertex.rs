//! Vertex data shared by the compute threads: arrays of relaxed atomics (same size and layout
//! as plain values) and an activity bitmap.
//!
//! In column order the thread that streams a column owns its destination chunk, so writes to
//! destinations are plain load/store pairs; the `*_shared` operations are read-modify-writes
//! for the sides no thread owns.
//!
//! Arrays live in the heap when the vertex data fits the budget, and otherwise in windows
//! ([`VertexMemory::Windowed`]): shared mappings of scratch files, of which the kernel keeps in
//! memory the pages a pass touches (the source chunk being read and the destination chunk being
//! written, GridGraph's dual sliding windows) and writes the rest back, within the process's
//! memory limit. Bitmaps are an eighth of a byte a vertex and always stay in the heap.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::error::{GridError, Result};

/// Where vertex arrays live.
#[derive(Debug)]
pub enum VertexMemory {
    /// Whole arrays in the heap.
    Heap,
    /// Shared mappings of unlinked scratch files in `dir` (see the module documentation).
    Windowed { dir: PathBuf, files: AtomicUsize },
}

impl VertexMemory {
    /// Windowed arrays with their scratch files in `dir` (created if missing).
    pub fn windowed(dir: &Path) -> Result<VertexMemory> {
        std::fs::create_dir_all(dir).map_err(|e| GridError::os("mkdir", dir, e))?;
        Ok(VertexMemory::Windowed {
            dir: dir.to_path_buf(),
            files: AtomicUsize::new(0),
        })
    }

    pub fn is_windowed(&self) -> bool {
        matches!(self, VertexMemory::Windowed { .. })
    }

    /// `n` zeroed cells of `A` (an atomic integer type, whose zero is all-zero bits).
    fn zeroed<A: Default>(&self, n: usize) -> Result<Cells<A>> {
        match self {
            VertexMemory::Heap => {
                let v: Vec<A> = (0..n).map(|_| A::default()).collect();
                Ok(Cells::new(Owner::Heap(v), n))
            }
            VertexMemory::Windowed { dir, files } => {
                let k = files.fetch_add(1, Relaxed);
                let path = dir.join(format!(".vertex-{}-{k}.scratch", std::process::id()));
                let bytes = (n * std::mem::size_of::<A>()).max(1) as u64;
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| GridError::os("create", &path, e))?;
                // A sparse file reads as zeros; unlinked at once, it vanishes with the mapping
                // even if the process dies.
                let mapped = file
                    .set_len(bytes)
                    .and_then(|_| unsafe { memmap2::MmapMut::map_mut(&file) });
                let _ = std::fs::remove_file(&path);
                let map = mapped.map_err(|e| GridError::os("map", &path, e))?;
                Ok(Cells::new(Owner::Mapped(map), n))
            }
        }
    }
}

/// The storage of an array: `len` cells at `ptr`, owned by a vector or a shared mapping. The
/// pointer is resolved once so that element access in the kernels' loops has no branch.
struct Cells<A> {
    ptr: *const A,
    len: usize,
    _owner: Owner<A>,
}

enum Owner<A> {
    Heap(Vec<A>),
    Mapped(memmap2::MmapMut),
}

// SAFETY: `Cells` owns its memory like a `Vec<A>` does, and `A` is an atomic type that threads
// share by design.
unsafe impl<A: Send + Sync> Send for Cells<A> {}
unsafe impl<A: Sync> Sync for Cells<A> {}

impl<A> Cells<A> {
    /// Cells over `owner`, which holds at least `len` of them at a suitably aligned address
    /// (a vector's buffer, or a page-aligned mapping).
    fn new(owner: Owner<A>, len: usize) -> Cells<A> {
        let ptr = match &owner {
            Owner::Heap(v) => v.as_ptr(),
            Owner::Mapped(m) => m.as_ptr() as *const A,
        };
        Cells {
            ptr,
            len,
            _owner: owner,
        }
    }
}

impl<A> std::ops::Deref for Cells<A> {
    type Target = [A];

    #[inline]
    fn deref(&self) -> &[A] {
        // SAFETY: `ptr` points at `len` initialised cells (atomic integers, valid for any bits,
        // zero-filled in a mapping) that live as long as `self._owner`; moving a Vec or a
        // mapping does not move its buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Defines a float array type over the atomic integer of the float's width (same size and
/// layout as the floats), with plain and shared updates.
macro_rules! float_array {
    ($(#[$doc:meta])* $name:ident, $float:ty, $atomic:ty) => {
        $(#[$doc])*
        pub struct $name(Cells<$atomic>);

        impl $name {
            /// `n` copies of `value`, in `mem`.
            pub fn filled(mem: &VertexMemory, n: usize, value: $float) -> Result<$name> {
                let a = $name(mem.zeroed(n)?);
                if value.to_bits() != 0 {
                    (0..n).for_each(|i| a.set(i, value));
                }
                Ok(a)
            }

            pub fn len(&self) -> usize {
                self.0.len()
            }

            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            #[inline]
            pub fn get(&self, i: usize) -> $float {
                <$float>::from_bits(self.0[i].load(Relaxed))
            }

            #[inline]
            pub fn set(&self, i: usize, v: $float) {
                self.0[i].store(v.to_bits(), Relaxed)
            }

            /// Adds to a value this thread owns.
            #[inline]
            pub fn add_owned(&self, i: usize, v: $float) {
                self.set(i, self.get(i) + v)
            }

            /// Adds to a value other threads may update at the same time.
            #[inline]
            pub fn add_shared(&self, i: usize, v: $float) {
                self.update_shared(i, |x| x + v)
            }

            /// Sets the value to `f(value)`, whoever else is writing.
            #[inline]
            pub fn update_shared(&self, i: usize, f: impl Fn($float) -> $float) {
                let _ = self.0[i].fetch_update(Relaxed, Relaxed, |x| {
                    Some(f(<$float>::from_bits(x)).to_bits())
                });
            }
        }
    };
}

float_array!(
    /// `f32` values.
    F32Array, f32, AtomicU32
);
float_array!(
    /// `f64` values (ranks, distances).
    F64Array, f64, AtomicU64
);

impl F64Array {
    /// Lowers a non-negative value to non-negative `v` if smaller (the bit patterns of
    /// non-negative floats order like their values); true if it changed.
    #[inline]
    pub fn min_shared(&self, i: usize, v: f64) -> bool {
        debug_assert!(v >= 0.0);
        self.0[i].fetch_min(v.to_bits(), Relaxed) > v.to_bits()
    }
}

/// Defines an integer array type over the atomic of the integer's width, with plain access
/// and the shared updates every width offers.
macro_rules! int_array {
    ($(#[$doc:meta])* $name:ident, $int:ty, $atomic:ty) => {
        $(#[$doc])*
        pub struct $name(Cells<$atomic>);

        impl $name {
            /// `n` copies of `value`, in `mem` (zeros as the memory comes, untouched).
            pub fn filled(mem: &VertexMemory, n: usize, value: $int) -> Result<$name> {
                match value {
                    0 => Ok($name(mem.zeroed(n)?)),
                    _ => $name::from_fn(mem, n, |_| value),
                }
            }

            /// Cell i set to `f(i)`, in `mem`.
            pub fn from_fn(
                mem: &VertexMemory,
                n: usize,
                f: impl Fn(usize) -> $int,
            ) -> Result<$name> {
                let a = $name(mem.zeroed(n)?);
                (0..n).for_each(|i| a.set(i, f(i)));
                Ok(a)
            }

            pub fn len(&self) -> usize {
                self.0.len()
            }

            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            #[inline]
            pub fn get(&self, i: usize) -> $int {
                self.0[i].load(Relaxed)
            }

            #[inline]
            pub fn set(&self, i: usize, v: $int) {
                self.0[i].store(v, Relaxed)
            }

            /// Sets the value to `new` if it is `old`, whoever else is writing; true if it did.
            #[inline]
            pub fn cas_shared(&self, i: usize, old: $int, new: $int) -> bool {
                self.0[i]
                    .compare_exchange(old, new, Relaxed, Relaxed)
                    .is_ok()
            }
        }
    };
}

int_array!(
    /// `u64` values (ids, levels, labels, counts).
    U64Array, u64, AtomicU64
);
int_array!(
    /// `u32` values (BFS levels of several sources a vertex).
    U32Array, u32, AtomicU32
);

impl U64Array {
    /// Lowers the value to `v` if smaller, whoever else is writing; true if it changed.
    #[inline]
    pub fn min_shared(&self, i: usize, v: u64) -> bool {
        self.0[i].fetch_min(v, Relaxed) > v
    }

    #[inline]
    pub fn add_shared(&self, i: usize, v: u64) -> u64 {
        self.0[i].fetch_add(v, Relaxed)
    }

    #[inline]
    pub fn sub_shared(&self, i: usize, v: u64) -> u64 {
        self.0[i].fetch_sub(v, Relaxed)
    }

    /// Sets the value to `f(value)`, whoever else is writing.
    #[inline]
    pub fn update_shared(&self, i: usize, f: impl Fn(u64) -> u64) {
        let _ = self.0[i].fetch_update(Relaxed, Relaxed, |x| Some(f(x)));
    }

    /// ORs `v` into the value, whoever else is writing; returns the value before.
    #[inline]
    pub fn or_shared(&self, i: usize, v: u64) -> u64 {
        self.0[i].fetch_or(v, Relaxed)
    }
}

/// One bit per vertex.
pub struct Bitmap {
    words: Vec<AtomicU64>,
    len: usize,
}

impl Bitmap {
    pub fn new(len: usize) -> Bitmap {
        Bitmap {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// A bitmap with every bit set.
    pub fn full(len: usize) -> Bitmap {
        let b = Bitmap::new(len);
        b.fill(true);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> bool {
        self.words[i / 64].load(Relaxed) & (1 << (i % 64)) != 0
    }

    #[inline]
    pub fn set(&self, i: usize) {
        self.words[i / 64].fetch_or(1 << (i % 64), Relaxed);
    }

    /// Sets bit `i`; true if it was clear (one caller of many racing to set it sees true).
    #[inline]
    pub fn set_new(&self, i: usize) -> bool {
        let bit = 1 << (i % 64);
        self.words[i / 64].fetch_or(bit, Relaxed) & bit == 0
    }

    #[inline]
    pub fn clear(&self, i: usize) {
        self.words[i / 64].fetch_and(!(1 << (i % 64)), Relaxed);
    }

    /// Sets or clears every bit.
    pub fn fill(&self, on: bool) {
        for (k, w) in self.words.iter().enumerate() {
            let bits = if !on {
                0
            } else if (k + 1) * 64 <= self.len {
                u64::MAX
            } else {
                (1u64 << (self.len - k * 64)) - 1
            };
            w.store(bits, Relaxed);
        }
    }

    /// Makes this bitmap a copy of `other` (same length) and clears `other`.
    pub fn take_from(&self, other: &Bitmap) {
        for (w, o) in self.words.iter().zip(&other.words) {
            w.store(o.swap(0, Relaxed), Relaxed);
        }
    }

    /// Bits set in `[start, end)`.
    pub fn count_range(&self, start: usize, end: usize) -> u64 {
        (start..end).filter(|&i| self.get(i)).count() as u64
    }

    /// Bits set.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(Relaxed).count_ones() as u64)
            .sum()
    }

    /// Whether any bit in `[start, end)` is set.
    pub fn any_range(&self, start: usize, end: usize) -> bool {
        let mut i = start;
        while i < end {
            if i.is_multiple_of(64) && i + 64 <= end {
                if self.words[i / 64].load(Relaxed) != 0 {
                    return true;
                }
                i += 64;
            } else {
                if self.get(i) {
                    return true;
                }
                i += 1;
            }
        }
        false
    }
}

/// Vertex arrays whose values travel in an exchange: `width` bytes a vertex.
pub trait Shared: Sync {
    fn width(&self) -> usize;
    /// Appends vertex `v`'s value.
    fn put(&self, v: usize, out: &mut Vec<u8>);
    /// Sets vertex `v`'s value from `bytes` (`width` of them).
    fn take(&self, v: usize, bytes: &[u8]);
}

macro_rules! shared_array {
    ($array:ty, $value:ty) => {
        impl Shared for $array {
            fn width(&self) -> usize {
                std::mem::size_of::<$value>()
            }
            fn put(&self, v: usize, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.get(v).to_le_bytes());
            }
            fn take(&self, v: usize, bytes: &[u8]) {
                self.set(
                    v,
                    <$value>::from_le_bytes(bytes.try_into().expect("width bytes")),
                );
            }
        }
    };
}
shared_array!(F32Array, f32);
shared_array!(F64Array, f64);
shared_array!(U64Array, u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_ranges() {
        let b = Bitmap::new(200);
        assert!(!b.any_range(0, 200));
        b.set(130);
        assert!(b.any_range(100, 131) && !b.any_range(131, 200) && !b.any_range(0, 130));
        assert_eq!(b.count(), 1);
        b.fill(true);
        assert_eq!(b.count(), 200);
        assert_eq!(b.count_range(190, 200), 10);
    }

    #[test]
    fn shared_updates() {
        let tmp = tempfile::tempdir().unwrap();
        for mem in [
            VertexMemory::Heap,
            VertexMemory::windowed(tmp.path()).unwrap(),
        ] {
            let a = F32Array::filled(&mem, 2, 1.0).unwrap();
            a.add_shared(0, 2.5);
            a.add_owned(1, 0.5);
            assert_eq!((a.get(0), a.get(1)), (3.5, 1.5));
            let u = U64Array::filled(&mem, 1, 10).unwrap();
            assert!(u.min_shared(0, 4));
            assert!(!u.min_shared(0, 7));
            assert_eq!(u.get(0), 4);
            let z = F64Array::filled(&mem, 3, 0.0).unwrap();
            assert_eq!(z.get(2), 0.0);
            let l = U32Array::filled(&mem, 3, u32::MAX).unwrap();
            assert!(l.cas_shared(1, u32::MAX, 4) && !l.cas_shared(1, u32::MAX, 5));
            assert_eq!((l.get(0), l.get(1), l.len()), (u32::MAX, 4, 3));
        }
    }

    #[test]
    fn windowed_arrays_leave_no_files_and_hold_more_than_a_page() {
        let tmp = tempfile::tempdir().unwrap();
        let mem = VertexMemory::windowed(&tmp.path().join("scratch")).unwrap();
        let n = 3 << 20;
        let a = U64Array::from_fn(&mem, n, |i| (i as u64) * 3).unwrap();
        assert_eq!(
            std::fs::read_dir(tmp.path().join("scratch"))
                .unwrap()
                .count(),
            0
        );
        assert!(a.min_shared(n - 1, 1));
        assert_eq!((a.get(0), a.get(12345), a.get(n - 1)), (0, 37035, 1));
    }
}
