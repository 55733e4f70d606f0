//! Co-location: a connection whose messages come (nearly) all from publishers served by one
//! other connection thread is asked to move there (see [`super::threads`]).

use tokio::sync::Notify;

/// Deliveries counted per decision on where a connection's messages come from.
const SOURCE_WINDOW: u32 = 128;
/// Of a window, how many must come from one other thread for the connection to move there.
const SOURCE_MAJORITY: u32 = SOURCE_WINDOW - SOURCE_WINDOW / 16;

/// Counts, over a window of deliveries, those routed on the same other connection thread in a
/// row (a delivery from a third thread starts the count again).
#[derive(Debug, Default)]
pub(crate) struct Sources {
    seen: u32,
    from: usize,
    from_count: u32,
}

/// A request that a connection move to another connection thread: its subscriptions are fed
/// (nearly) only by publishers served there, so each message crosses between threads, a
/// wake-up of the receiving thread and a hand-off on every publish. The connection's reader
/// moves it when it can (see `connection::Conn::try_move`).
#[derive(Debug, Default)]
pub(crate) struct Relocate {
    /// The thread to move to, as [`super::current_home`] numbers them; 0 for none.
    target: std::sync::atomic::AtomicUsize,
    pub(crate) asked: Notify,
}

impl Relocate {
    pub(crate) fn ask(&self, home: usize) {
        self.target
            .store(home, std::sync::atomic::Ordering::Relaxed);
        self.asked.notify_one();
    }

    /// Whether a move was asked for and not yet taken.
    pub(crate) fn pending(&self) -> bool {
        self.target.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// Takes the thread asked for, if any.
    pub(crate) fn take(&self) -> usize {
        self.target.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Sources {
    /// Counts a delivery routed on connection thread `from` (0: off the connection threads, not
    /// counted) to a connection served on thread `home`, and asks it through `relocate` to move
    /// once a window's deliveries came from one other thread.
    pub(crate) fn count(&mut self, from: usize, home: usize, relocate: &Relocate) {
        if from == 0 || home == 0 {
            return;
        }
        self.seen += 1;
        if from != home {
            if from == self.from {
                self.from_count += 1;
            } else {
                self.from = from;
                self.from_count = 1;
            }
        }
        if self.seen >= SOURCE_WINDOW {
            if self.from_count >= SOURCE_MAJORITY {
                relocate.ask(self.from);
            }
            *self = Sources::default();
        }
    }
}
