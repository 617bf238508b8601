//! What the engine and its backends exchange: the [`Transfer`] a backend performs (one read or
//! write system call) and, through [`Advance`], the engine's account of its result. The
//! backends see the engine only through this trait, so they need nothing of `mod.rs`.

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// The bytes a request still has to move: the argument of one read/write system call.
#[derive(Clone, Copy)]
pub(super) struct Transfer {
    pub op: Op,
    pub fd: i32,
    pub fixed_file: Option<u32>,
    pub fixed_buf: Option<u16>,
    pub ptr: *mut u8,
    pub len: usize,
    pub offset: u64,
}

// SAFETY: the pointer refers to a buffer owned by the in-flight slot until the transfer ends.
unsafe impl Send for Transfer {}

/// What to do after a system call returned.
pub(super) enum Next {
    Again(Transfer),
    Done,
}

/// The engine's side of a transfer: what a backend calls with each system call's result.
pub(super) trait Advance {
    /// Accounts for `res` (bytes moved, or `-errno`) on the request in slot `id`: the next
    /// transfer of a partly done request, or `Done` once its completion is delivered.
    fn advance(&self, id: usize, res: i64) -> Next;
}
