//! `watch KEY...`: one line per change until interrupted.
//!
//! Text lines are `TIME OPERATION KEY VERSION [VALUE]`; with `--json`, one
//! object per line. A change made while the connection was down is reported
//! after reconnecting, preceded in text mode by a note on standard error
//! and marked `"synthesized": true` in JSON.

use std::ffi::OsString;

use clap::Args;
use mqkv_client::{ConnectionStatus, KeyNotification, Operation};
use serde_json::json;
use tokio::sync::mpsc;

use super::conn::ConnectionArgs;
use super::output::{self, OutputArgs};
use super::signal::Signals;
use super::value::key_bytes;
use super::EXIT_OK;

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The keys to watch (they need not exist yet).
    #[arg(required = true)]
    pub keys: Vec<OsString>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn run(args: WatchArgs) -> anyhow::Result<i32> {
    let mut signals = Signals::new();
    let client = args.conn.connect().await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<KeyNotification>();
    let mut observations = Vec::new();
    for key in &args.keys {
        observations.push(client.observe(key_bytes(key)).await?);
    }
    // One forwarding task per key merges the streams in arrival order.
    let mut forwarders = Vec::new();
    for mut observation in observations {
        let tx = tx.clone();
        forwarders.push(tokio::spawn(async move {
            while let Some(change) = observation.recv().await {
                if tx.send(change).is_err() {
                    break;
                }
            }
        }));
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
