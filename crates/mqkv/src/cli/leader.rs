//! `leader NAME`: campaigns in the election NAME and prints one line per
//! change of leader until interrupted, then resigns.
//!
//! Text lines are `TIME leader ID`, with ` (this process)` when this
//! candidate leads, or `TIME no leader`. With `--json`, one object per line.

use std::ffi::OsString;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use mqkv_client::{Hlc, LeaderElection, LeaseLost};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::conn::ConnectionArgs;
use super::output::{self, OutputArgs};
use super::signal::Signals;
use super::value::key_bytes;
use super::EXIT_OK;

#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// The election's name (its key in the state store).
    pub name: OsString,
    /// Candidate name (default: the client id).
    #[arg(long, value_name = "NAME")]
    pub candidate: Option<OsString>,
    /// Term in milliseconds: a leader that stops renewing is replaced this long after its last
    /// renewal. Renewed every third of it.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(30..))]
    pub ttl: u64,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

enum Campaign {
    Elected,
    Lost(LeaseLost),
    Failed(mqkv_client::Error),
}

pub async fn run(args: LeaderArgs) -> anyhow::Result<i32> {
    let mut signals = Signals::new();
    let name = key_bytes(&args.name);
    let term = Duration::from_millis(args.ttl);
    let client = args.conn.connect().await?;
    let election = match &args.candidate {
        Some(candidate) => LeaderElection::new(&client, name.clone(), key_bytes(candidate)),
        None => LeaderElection::for_client(&client, name.clone()),
    };
    let me = election.candidate().clone();
    let out = args.output;
    let mut watch = election.observe_leader().await?;
    report(&out, &name, &me, watch.current(), None)?;

    // The campaign runs on its own so that waiting for the lock is never
    // interrupted half-way by the reporting below.
    let (tx, mut events) = mpsc::unbounded_channel();
    let campaign = tokio::spawn({
        let election = election.clone();
        async move {
            loop {
                match election.campaign(term).await {
                    Ok(mut leadership) => {
                        let _ = tx.send(Campaign::Elected);
                        let lost = leadership.lost().await;
                        let _ = tx.send(Campaign::Lost(lost));
                    }
                    Err(e) => {
                        let _ = tx.send(Campaign::Failed(e));
                        return;
                    }
                }
            }
        }
    });

    let result = loop {
        tokio::select! {
            change = watch.changed() => match change {
                Some(change) => report(&out, &name, &me, change.leader.as_ref(), Some(&change.version))?,
                None => break Err(anyhow::anyhow!("the connection was closed")),
            },
            event = events.recv() => match event {
                Some(Campaign::Elected) | None => {}
                Some(Campaign::Lost(why)) => eprintln!("mqkv: lost the leadership ({why:?}); campaigning again"),
                Some(Campaign::Failed(e)) => break Err(e.into()),
            },
            _ = signals.next() => break Ok(EXIT_OK),
        }
    };
    // Stop renewing, then step down (only deletes the key if it names us).
    campaign.abort();
    let _ = campaign.await;
    let resigned = election.resign().await;
    client.disconnect().await;
    if let (Ok(_), Err(e)) = (&result, resigned) {
        eprintln!("mqkv: resigning failed (the term runs out by itself): {e}");
    }
    result
}

fn report(
    out: &OutputArgs,
    election: &Bytes,
    me: &Bytes,
    leader: Option<&Bytes>,
    version: Option<&Hlc>,
) -> std::io::Result<()> {
    let time = output::now_rfc3339();
    let is_me = leader == Some(me);
    if out.json {
        return output::json_line(&json!({
            "time": time,
            "election": out.json_bytes(election),
            "leader": leader.map_or(Value::Null, |l| out.json_bytes(l)),
            "self": is_me,
            "version": version.map_or(Value::Null, |v| Value::String(v.to_string())),
        }));
    }
    match leader {
        Some(leader) => output::line(&format!(
            "{time} leader {}{}",
            out.text(leader, false),
            if is_me { " (this process)" } else { "" }
        )),
        None => output::line(&format!("{time} no leader")),
    }
}
