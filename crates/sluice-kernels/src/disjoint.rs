//! Parallel writes into one output buffer at disjoint places.
//!
//! The kernels split an output (a matrix's columns, attention's `(token, head)` rows) over
//! rayon tasks, each of which writes only its own part. Rust's borrow rules cannot see that
//! the parts are disjoint when they interleave (column groups of every row), so the tasks share
//! a raw pointer instead; this type is that pointer, once, with the contract written down.

use std::marker::PhantomData;

/// A mutable slice shared by parallel tasks that promise to write disjoint elements.
///
/// Holding one is safe; writing through it is `unsafe` because the promise cannot be checked.
#[derive(Clone, Copy)]
pub struct DisjointSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a `DisjointSlice` is a `&mut [T]` split among threads; sending or sharing it is sound
// when `T` may be sent, and every write through it goes through `unsafe` methods whose callers
// guarantee that no element is written by two threads or read while another writes it.
unsafe impl<T: Send> Send for DisjointSlice<'_, T> {}
// SAFETY: as above: shared access only hands out the pointer; writes are the callers' promise.
unsafe impl<T: Send> Sync for DisjointSlice<'_, T> {}

impl<'a, T> DisjointSlice<'a, T> {
    /// Borrows `out` mutably for as long as the tasks run.
    pub fn new(out: &'a mut [T]) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first element's pointer, for kernels that address the output themselves.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    /// `len` elements from `start`, for one task to write.
    ///
    /// # Safety
    /// `start + len <= self.len()`, and while the returned slice lives no other task reads or
    /// writes any of its elements.
    pub unsafe fn slice_mut(&self, start: usize, len: usize) -> &'a mut [T] {
        debug_assert!(start + len <= self.len, "{start}+{len} past {}", self.len);
        // SAFETY: in bounds of the borrowed slice (the caller's first promise), and exclusive
        // for the slice's lifetime (the second).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
