//! `watch KEY...`: one line per change until interrupted. A KEY with a glob metacharacter
//! (`*`, `?`, `[`) is a pattern (an mqkv extension): every key it matches is watched, existing
//! or not yet; `--exact` takes such arguments as keys.
//!
//! Text lines are `TIME OPERATION KEY VERSION [VALUE]`; with `--json`, one
//! object per line. A change made while the connection was down is reported
//! after reconnecting, preceded in text mode by a note on standard error
//! and marked `"synthesized": true` in JSON.

use std::ffi::OsString;

use clap::Args;
use mqkv_client::{ConnectionStatus, Hlc, KeyNotification, Operation};
use serde_json::json;
use tokio::sync::mpsc;

use super::conn::ConnectionArgs;
use super::kv::parse_hlc;
use super::output::{self, OutputArgs};
use super::signal::Signals;
use super::value::key_bytes;
use super::EXIT_OK;

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The keys to watch (they need not exist yet); one with `*`, `?` or `[` is a glob
    /// pattern and watches every key it matches.
    #[arg(required = true)]
    pub keys: Vec<OsString>,
    /// Take every argument as a key, even one with glob metacharacters.
    #[arg(long)]
    pub exact: bool,
    /// First print every change of the keys (or of the keys the patterns match) after this
    /// version, one printed before say, then go on live: nothing missed, nothing twice (an
    /// mqkv extension).
    #[arg(long, value_name = "VERSION", value_parser = parse_hlc)]
    pub since: Option<Hlc>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn run(args: WatchArgs) -> anyhow::Result<i32> {
    let mut signals = Signals::new();
    let client = args.conn.connect().await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<KeyNotification>();
    // One forwarding task per key or pattern merges the streams in arrival order.
    let mut forwarders = Vec::new();
    for key in &args.keys {
        let key = key_bytes(key);
        let tx = tx.clone();
        let pattern = !args.exact && key.iter().any(|b| matches!(b, b'*' | b'?' | b'['));
        let changes: Changes = match (&args.since, pattern) {
            (Some(since), true) => {
                Box::pin(client.observe_pattern_since(key, since.clone()).await?)
            }
            (Some(since), false) => Box::pin(client.observe_since(key, since.clone()).await?),
            (None, true) => Box::pin(client.observe_pattern(key).await?),
            (None, false) => Box::pin(client.observe(key).await?),
        };
        forwarders.push(tokio::spawn(forward(changes, tx)));
    }
    drop(tx);
    let mut status = client.status();
    let out = args.output;
    let result = loop {
        tokio::select! {
            change = rx.recv() => match change {
                Some(change) => print_change(&out, &change)?,
                None => break Err(anyhow::anyhow!("the connection was closed")),
            },
            now = status.changed() => match now {
                ConnectionStatus::Reconnecting => eprintln!("mqkv: connection lost; reconnecting"),
                ConnectionStatus::Connected { .. } => eprintln!("mqkv: reconnected"),
                ConnectionStatus::Closed => {}
            },
            _ = signals.next() => break Ok(EXIT_OK),
        }
    };
    // Disconnecting ends the server's registrations with the connection.
    for forwarder in forwarders {
        forwarder.abort();
    }
    client.disconnect().await;
    result
}

/// The changes of one key or pattern.
type Changes = std::pin::Pin<Box<dyn futures_core::Stream<Item = KeyNotification> + Send>>;

/// Sends every change of `changes` to `tx` until either ends.
async fn forward(mut changes: Changes, tx: mpsc::UnboundedSender<KeyNotification>) {
    while let Some(change) = std::future::poll_fn(|cx| changes.as_mut().poll_next(cx)).await {
        if tx.send(change).is_err() {
            break;
        }
    }
}

fn print_change(out: &OutputArgs, change: &KeyNotification) -> std::io::Result<()> {
    let time = output::now_rfc3339();
    let (operation, value) = match &change.operation {
        Operation::Set { value } => ("SET", Some(value)),
        Operation::Delete => ("DELETE", None),
    };
    if out.json {
        let mut line = json!({
            "time": time,
            "key": out.json_bytes(&change.key),
            "operation": operation,
            "version": change.version.to_string(),
            "synthesized": change.synthesized,
        });
        if let Some(value) = value {
            line["value"] = out.json_bytes(value);
        }
        return output::json_line(&line);
    }
    if change.synthesized {
        eprintln!(
            "mqkv: {} changed while disconnected:",
            out.text(&change.key, false)
        );
    }
    let prefix = format!(
        "{time} {operation} {} {}",
        out.text(&change.key, false),
        change.version
    );
    match value {
        Some(value) => out.write_stream_item(&format!("{prefix} "), value),
        None => output::line(&prefix),
    }
}
