//! SIGINT and SIGTERM as events, so long-running commands (watch, lock,
//! leader) can clean up (unobserve, release, resign) before exiting.

/// Which signal arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

/// Listens for SIGINT and SIGTERM from creation on; from then on their
/// default action (ending the process at once) no longer applies.
pub struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal.as_mut() {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

impl Signals {
    pub fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = recv(&mut self.interrupt) => Stop::Interrupt,
                _ = recv(&mut self.terminate) => Stop::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
}
