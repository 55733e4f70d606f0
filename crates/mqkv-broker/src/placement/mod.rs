//! Where connections run, and the machinery that makes that fast: connection threads each with
//! a runtime of their own, CPU pinning and batch scheduling ([`affinity`]), connections moving
//! to the thread that feeds them ([`colocate`]), output and wake-ups posted between threads in
//! batches, and the thread lent to the state store.
//!
//! The rest of the broker sees a narrow interface: which thread it runs on
//! ([`current_home`]), the threads to place, spawn and move connections on ([`ConnThreads`]),
//! the [`Output`] a connection implements so that other threads can have its output written,
//! and a waker for services' futures ([`CachedWaker`]). Protocol code does not look behind it.

mod affinity;
mod colocate;
mod threads;
mod tidy;
mod waker;

pub(crate) use colocate::{Relocate, Sources};
pub use threads::LentThread;
pub(crate) use threads::{current_home, ConnThreads};
pub use tidy::{release_freed_memory, release_freed_memory_periodically, set_release_freed_memory};
pub(crate) use waker::CachedWaker;

use threads::home_waker;

/// Output a connection has ready, written from whichever task asks: its own thread's tasks
/// write it at once, other threads post it to the connection's thread. Implemented by the
/// connection; a session holds one, not the socket.
pub(crate) trait Output: Send + Sync + std::fmt::Debug {
    /// Writes what the connection's session has ready, as far as the socket takes it without
    /// waiting, or leaves it to the connection's writer task, as the connection's transport
    /// decides. `fan_out`: what is ready is one of the deliveries of a message to several
    /// subscribers.
    fn write_ready(&self, fan_out: bool);
}
