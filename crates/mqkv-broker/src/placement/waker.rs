//! Wakers for tasks of connection threads that batch wake-ups from other threads (see
//! [`super::threads`]).

use std::task::{Context, Poll, Waker};

use crate::service::{OutboundMessage, ServiceFuture};

/// A task's waker wrapped by [`super::home_waker`], made once and reused while the
/// task's waker stays the same.
#[derive(Default)]
pub(crate) struct CachedWaker(Option<(Waker, Waker)>);

impl CachedWaker {
    pub(crate) fn get(&mut self, task: &Waker) -> &Waker {
        let fresh = !matches!(&self.0, Some((t, _)) if t.will_wake(task));
        if fresh {
            self.0 = None;
        }
        let (_, wrapped) = self
            .0
            .get_or_insert_with(|| (task.clone(), super::home_waker(task)));
        wrapped
    }

    /// Polls a service's future with the task's waker, wrapped.
    pub(crate) fn poll(
        &mut self,
        future: &mut ServiceFuture,
        cx: &mut Context<'_>,
    ) -> Poll<Option<OutboundMessage>> {
        future
            .as_mut()
            .poll(&mut Context::from_waker(self.get(cx.waker())))
    }
}
