//! `lock NAME -- COMMAND...`: waits for the lock, runs the command while
//! renewing it, releases it, and exits with the command's status.
//!
//! Invariant: the command never runs without the lock. If the lock is lost
//! while it runs (renewals failed until it expired, or another holder took
//! it), the command is killed rather than left running unprotected. Unless
//! it runs from a terminal, it gets a process group of its own, so
//! everything it started is killed with it; interactive commands stay in
//! the terminal's foreground group, where they can read the terminal.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use mqkv_client::{LeaseLost, Lock};
use serde_json::json;

use super::conn::ConnectionArgs;
use super::output::{self, OutputArgs};
use super::signal::{Signals, Stop};
use super::value::key_bytes;
use super::{EXIT_ERROR, EXIT_NOT_APPLIED};

pub const AFTER_HELP: &str = "\
The command gets MQKV_LOCK_NAME and MQKV_FENCING_TOKEN in its environment; pass the token
with --fencing-token to writes that the lock protects. SIGINT and SIGTERM are passed on to the
command. If the lock is lost while the command runs, the command is killed (with every process it
started, unless standard input is a terminal).

Exit codes:
  the command's own status (128 + N if it was killed by signal N)
  2  --wait passed without getting the lock
  3  error: connection, server error, usage, the command could not start, or the lock was
     lost while the command ran (the command is then killed)";

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The lock's name (its key in the state store).
    pub name: OsString,
    /// Lease time in milliseconds; the lock is renewed every third of it.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(30..))]
    pub ttl: u64,
    /// Give up after waiting this many milliseconds for the lock (default: wait forever).
    #[arg(long, value_name = "MS")]
    pub wait: Option<u64>,
    /// The command to run, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn run(args: LockArgs) -> anyhow::Result<i32> {
    let Some((program, program_args)) = args.command.split_first() else {
        anyhow::bail!("no command given after --");
    };
    let mut signals = Signals::new();
    let name = key_bytes(&args.name);
    let ttl = Duration::from_millis(args.ttl);
    let client = args.conn.connect().await?;
    let lock = Lock::for_client(&client, name.clone());
    let out = args.output;

    let acquired = tokio::select! {
        acquired = async {
            match args.wait {
                Some(ms) => lock.lock_within(ttl, Duration::from_millis(ms)).await,
                None => lock.lock(ttl).await.map(Some),
            }
        } => acquired,
        _ = signals.next() => {
            // An acquire may have been in flight: release whatever is ours.
            let _ = lock.unlock().await;
            client.disconnect().await;
            anyhow::bail!("interrupted while waiting for the lock");
        }
    };
    let token = match acquired {
        Ok(Some(token)) => token,
        Ok(None) => {
            client.disconnect().await;
            if out.json {
                output::json_line(&json!({
                    "event": "not_acquired",
                    "lock": out.json_bytes(&name),
                }))?;
            } else {
                eprintln!(
                    "mqkv: the lock {} is still held after {} ms",
                    out.text(&name, false),
                    args.wait.unwrap_or_default()
                );
            }
            return Ok(EXIT_NOT_APPLIED);
        }
        Err(e) => {
            client.disconnect().await;
            return Err(e.into());
        }
    };
    let mut renewal = lock.lease().keep_renewed(ttl, ttl / 3);
    if out.json {
        output::json_line(&json!({
            "event": "acquired",
            "lock": out.json_bytes(&name),
            "fencing_token": token.to_string(),
        }))?;
    }

    let own_group = !std::io::stdin().is_terminal();
    let mut command = tokio::process::Command::new(program);
    command
        .args(program_args)
        .env("MQKV_LOCK_NAME", &args.name)
        .env("MQKV_FENCING_TOKEN", token.to_string());
    #[cfg(unix)]
    if own_group {
        command.process_group(0);
    }
    let spawned = command
        .spawn()
        .with_context(|| format!("cannot run {}", program.to_string_lossy()));
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            renewal.stop();
            let _ = lock.unlock().await;
            client.disconnect().await;
            return Err(e);
        }
    };

    let outcome = loop {
        tokio::select! {
            status = child.wait() => break Outcome::Finished(status),
            lost = renewal.lost() => {
                kill_command(&mut child, own_group).await;
                break Outcome::Lost(lost);
            }
            stop = signals.next() => {
                // The command decides when it is done; it only hears of the
                // signal. From a terminal, SIGINT reaches it by itself.
                match (stop, own_group) {
                    (Stop::Interrupt, true) => signal_command(&child, true, Signal::Interrupt),
                    (Stop::Interrupt, false) => {}
                    (Stop::Terminate, group) => signal_command(&child, group, Signal::Terminate),
                }
            }
        }
    };
    renewal.stop();
    let released = lock.unlock().await;
    client.disconnect().await;

    let code = match outcome {
        Outcome::Finished(status) => {
            let status = status.context("cannot wait for the command")?;
            exit_code(status)
        }
        Outcome::Lost(why) => {
            let why = match why {
                LeaseLost::TakenOver => "another holder took it",
                LeaseLost::Expired => "it could not be renewed in time",
                LeaseLost::Closed => "the connection was closed",
            };
            eprintln!(
                "mqkv: lost the lock {} while the command ran ({why}); the command was killed",
                out.text(&name, false)
            );
            EXIT_ERROR
        }
    };
    if let Err(e) = released {
        eprintln!("mqkv: releasing the lock failed (it expires by itself): {e}");
    }
    if out.json {
        output::json_line(&json!({
            "event": "released",
            "lock": out.json_bytes(&name),
            "exit_code": code,
        }))?;
    }
    Ok(code)
}

enum Outcome {
    Finished(std::io::Result<std::process::ExitStatus>),
    Lost(LeaseLost),
}

/// The shell's convention: the status, or 128 + the signal that killed it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    EXIT_ERROR
}

#[derive(Clone, Copy)]
enum Signal {
    Interrupt,
    Terminate,
    Kill,
}

/// Sends a signal to the command, or to its whole process group.
fn signal_command(child: &tokio::process::Child, group: bool, signal: Signal) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|id| libc::pid_t::try_from(id).ok()) {
        let signal = match signal {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
        };
        let target = if group { -pid } else { pid };
        // SAFETY: kill(2) only sends a signal. `pid` is our own child, not
        // yet reaped (its id is still known), so neither it nor the process
        // group it leads can name an unrelated process.
        unsafe {
            libc::kill(target, signal);
        }
    }
    #[cfg(not(unix))]
    let _ = (child, group, signal);
}

async fn kill_command(child: &mut tokio::process::Child, own_group: bool) {
    if own_group {
        signal_command(child, true, Signal::Kill);
        let _ = child.wait().await;
    } else {
        let _ = child.kill().await;
    }
}
