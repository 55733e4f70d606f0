//! `mqkv cluster status|add-node|remove-node` and `mqkv reload`: requests to the
//! administration topic of whichever node `--host/--port` names.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::{Args, Subcommand};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event};
use serde_json::{json, Value};

use super::conn::ConnectionArgs;
use super::output;
use super::EXIT_OK;

/// The administration topic (see `mqkv_server::admin`).
const ADMIN_TOPIC: &str = "$mqkv/cluster/v1/invoke";

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Print every node: id, addresses, role, term, last applied entry and lag.
    Status(StatusArgs),
    /// Add node ID, reached by the other nodes at ADDR: it catches up, then votes.
    AddNode(AddNodeArgs),
    /// Remove node ID from the group.
    RemoveNode(RemoveNodeArgs),
    /// Make the connected node act as if cut off from the given nodes (none: heal). Needs a
    /// node started with --fault-injection; for testing.
    Isolate(IsolateArgs),
}

#[derive(Args)]
pub struct IsolateArgs {
    /// Ids of the nodes to be cut off from.
    from: Vec<u64>,
    #[command(flatten)]
    conn: ConnectionArgs,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ConnectionArgs,
}

#[derive(Args)]
pub struct AddNodeArgs {
    /// The new node as ID=HOST:PORT (its cluster address).
    #[arg(value_parser = parse_member)]
    node: (u64, String),
    #[command(flatten)]
    conn: ConnectionArgs,
}

#[derive(Args)]
pub struct RemoveNodeArgs {
    /// The node's id.
    id: u64,
    #[command(flatten)]
    conn: ConnectionArgs,
}

#[derive(Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    conn: ConnectionArgs,
}

/// `mqkv reload`.
pub async fn reload(args: ReloadArgs) -> anyhow::Result<i32> {
    ask(&args.conn, json!({ "command": "reload" })).await?;
    output::line("reloaded")?;
    Ok(EXIT_OK)
}

fn parse_member(s: &str) -> Result<(u64, String), String> {
    mqkv_server::config::parse_peer(s)
}

pub async fn run(command: ClusterCommand) -> anyhow::Result<i32> {
    match command {
        ClusterCommand::Status(args) => {
            let answer = ask(&args.conn, json!({ "command": "status" })).await?;
            let status = answer
                .get("status")
                .ok_or_else(|| anyhow!("the answer has no status: {answer}"))?;
            if args.json {
                output::json_line(status)?;
            } else {
                print_table(status)?;
            }
            Ok(EXIT_OK)
        }
        ClusterCommand::AddNode(args) => {
            let (id, addr) = args.node;
            ask(
                &args.conn,
                json!({ "command": "add-node", "id": id, "addr": addr }),
            )
            .await?;
            output::line(&format!("node {id} added"))?;
            Ok(EXIT_OK)
        }
        ClusterCommand::Isolate(args) => {
            ask(
                &args.conn,
                json!({ "command": "isolate", "from": args.from }),
            )
            .await?;
            Ok(EXIT_OK)
        }
        ClusterCommand::RemoveNode(args) => {
            ask(
                &args.conn,
                json!({ "command": "remove-node", "id": args.id }),
            )
            .await?;
            output::line(&format!("node {} removed", args.id))?;
            Ok(EXIT_OK)
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn print_table(status: &Value) -> std::io::Result<()> {
    let mut rows = vec![[
        "ID", "ROLE", "VOTER", "MQTT", "CLUSTER", "TERM", "APPLIED", "LAG", "ERROR",
    ]
    .map(String::from)];
    for node in status["nodes"].as_array().into_iter().flatten() {
        rows.push(
            [
                "id",
                "role",
                "voter",
                "mqtt",
                "cluster_addr",
                "term",
                "applied",
                "lag",
                "error",
            ]
            .map(|field| text(&node[field])),
        );
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    output::line(&format!("leader: {}", text(&status["leader"])))?;
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        output::line(line.join("  ").trim_end())?;
    }
    Ok(())
}

/// Sends one request and returns the answer's JSON when it says `ok`.
async fn ask(conn: &ConnectionArgs, request: Value) -> anyhow::Result<Value> {
    let client_id = conn
        .client_id
        .clone()
        .unwrap_or_else(|| format!("mqkv-cluster-{:016x}", rand::random::<u64>()));
    let options = conn
        .options()?
        .client_id(client_id.clone())
        .mqtt_options()?;
    let (client, mut events) = AsyncClient::new(options, 16);
    let response_topic = format!("mqkv-cli/{client_id}/cluster");
    let correlation = Bytes::from(rand::random::<u64>().to_be_bytes().to_vec());
    let timeout = Duration::from_millis(conn.timeout);
    let exchange = async {
        client
            .subscribe(response_topic.clone(), QoS::AtLeastOnce)
            .await
            .context("cannot subscribe")?;
        loop {
            match events.poll().await.context("connection to the broker")? {
                Event::Incoming(Packet::SubAck(_)) => break,
                Event::Incoming(Packet::ConnAck(ack))
                    if ack.code != rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success =>
                {
                    bail!("the broker refused the connection: {:?}", ack.code)
                }
                _ => {}
            }
        }
        let properties = PublishProperties {
            response_topic: Some(response_topic.clone()),
            correlation_data: Some(correlation.clone()),
            ..Default::default()
        };
        client
            .publish_with_properties(
                ADMIN_TOPIC,
                QoS::AtLeastOnce,
                false,
                request.to_string(),
                properties,
            )
            .await
            .context("cannot publish the request")?;
        loop {
            if let Event::Incoming(Packet::Publish(p)) =
                events.poll().await.context("connection to the broker")?
            {
                let matches = p
                    .properties
                    .as_ref()
                    .and_then(|pp| pp.correlation_data.as_ref())
                    == Some(&correlation);
                if matches {
                    return serde_json::from_slice::<Value>(&p.payload)
                        .context("the answer is not JSON");
                }
            }
        }
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow!("no answer within {} ms", conn.timeout))??;
    let _ = client.disconnect().await;
    if answer["ok"] == Value::Bool(true) {
        Ok(answer)
    } else {
        bail!("{}", text(&answer["error"]))
    }
}
