//! Cluster administration over MQTT: `mqkv cluster status`, `add-node` and `remove-node` send
//! their requests here, on whichever node they connect to.
//!
//! A request is a QoS 1 PUBLISH to [`ADMIN_TOPIC`] with a response topic and correlation
//! data; its payload is one JSON object:
//!
//! ```text
//! {"command": "status"}
//! {"command": "add-node", "id": 4, "addr": "127.0.0.1:7004"}
//! {"command": "remove-node", "id": 4}
//! {"command": "isolate", "from": [2, 3]}   (only with fault injection on; [] heals)
//! {"command": "reload"}                    (reads the TLS, password, token and policy files again)
//! ```
//!
//! The answer is one JSON object: `{"ok": true, "status": {...}}` for a status (see
//! [`mqkv_raft::ClusterStatus`]), `{"ok": true}` for a membership change made, and
//! `{"ok": false, "error": "..."}` otherwise (a reload some of whose files failed says how
//! many). Membership changes and reloads are taken only from clients connected over a loopback
//! address: they decide who holds the data and who may do what.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use mqkv_broker::codec::{Properties, QoS};
use mqkv_broker::{Broker, Handled, OutboundMessage, Service, ServicePublish};
use mqkv_raft::StoreNode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::reload::Reloader;

/// Where administration requests go.
pub const ADMIN_TOPIC: &str = "$mqkv/cluster/v1/invoke";

#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case", deny_unknown_fields)]
enum AdminRequest {
    Status,
    AddNode { id: u64, addr: String },
    RemoveNode { id: u64 },
    Isolate { from: Vec<u64> },
    Reload,
}

/// Serves [`ADMIN_TOPIC`].
pub struct AdminService {
    node: StoreNode,
    fault_injection: bool,
    /// What `reload` reads again, once the server has it.
    reloader: Arc<OnceLock<Arc<Reloader>>>,
}

impl AdminService {
    /// `fault_injection` enables the `isolate` command.
    pub fn start(
        broker: &Broker,
        node: StoreNode,
        fault_injection: bool,
        reloader: Arc<OnceLock<Arc<Reloader>>>,
    ) {
        broker.claim(
            &[ADMIN_TOPIC],
            Arc::new(AdminService {
                node,
                fault_injection,
                reloader,
            }),
        );
    }
}

impl Service for AdminService {
    fn on_publish(&self, mut p: ServicePublish, _earlier_running: bool) -> Handled {
        let (Some(topic), Some(correlation)) = (
            p.properties.response_topic.take(),
            p.properties.correlation_data.take(),
        ) else {
            tracing::warn!(client_id = %p.from.client_id, "cluster request without response topic or correlation data dropped");
            return Handled::Done(None);
        };
        let reply = move |body: Value| {
            Some(OutboundMessage {
                topic,
                payload: Bytes::from(body.to_string()),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties {
                    correlation_data: Some(correlation),
                    ..Default::default()
                },
            })
        };
        let request: AdminRequest = match serde_json::from_slice(&p.payload) {
            Ok(r) => r,
            Err(e) => return Handled::Done(reply(refused(format!("not a cluster request: {e}")))),
        };
        let trusted = p.from.peer.ip().is_loopback();
        let node = self.node.clone();
        let fault_injection = self.fault_injection;
        let reloader = self.reloader.get().cloned();
        Handled::Running(Box::pin(async move {
            let body = match request {
                AdminRequest::Status => match node.cluster_status().await {
                    Some(status) => json!({ "ok": true, "status": status }),
                    None => refused("this node is not part of a cluster".into()),
                },
                AdminRequest::AddNode { .. }
                | AdminRequest::RemoveNode { .. }
                | AdminRequest::Isolate { .. }
                    if !trusted =>
                {
                    refused("membership changes are taken only from loopback clients".into())
                }
                AdminRequest::Reload if !trusted => {
                    refused("reloads are taken only from loopback clients".into())
                }
                AdminRequest::Reload => match reloader {
                    None => refused("the server is still starting".into()),
                    Some(reloader) => {
                        tracing::info!("reload asked for: reading the TLS files, the password file, the token keys and the policy again");
                        match tokio::task::spawn_blocking(move || reloader.reload()).await {
                            Ok(failed) if failed.is_empty() => json!({ "ok": true }),
                            Ok(failed) => refused(format!(
                                "{} file(s) failed to load and stay as they were ({}); the server log says why",
                                failed.len(),
                                failed.join(", ")
                            )),
                            Err(e) => refused(format!("reload failed: {e}")),
                        }
                    }
                },
                AdminRequest::Isolate { .. } if !fault_injection => {
                    refused("fault injection is off on this node (--fault-injection)".into())
                }
                AdminRequest::Isolate { from } => {
                    tracing::warn!(
                        ?from,
                        "fault injection: acting as if cut off from these nodes"
                    );
                    node.isolate_from(from);
                    json!({ "ok": true })
                }
                AdminRequest::AddNode { id, addr } => match node.add_node(id, addr).await {
                    Ok(()) => json!({ "ok": true }),
                    Err(e) => refused(e.to_string()),
                },
                AdminRequest::RemoveNode { id } => match node.remove_node(id).await {
                    Ok(()) => json!({ "ok": true }),
                    Err(e) => refused(e.to_string()),
                },
            };
            reply(body)
        }))
    }
}

fn refused(error: String) -> Value {
    json!({ "ok": false, "error": error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_strangers_do_not() {
        assert!(matches!(
            serde_json::from_str::<AdminRequest>(r#"{"command":"status"}"#),
            Ok(AdminRequest::Status)
        ));
        assert!(matches!(
            serde_json::from_str::<AdminRequest>(r#"{"command":"add-node","id":4,"addr":"h:1"}"#),
            Ok(AdminRequest::AddNode { id: 4, .. })
        ));
        assert!(matches!(
            serde_json::from_str::<AdminRequest>(r#"{"command":"remove-node","id":2}"#),
            Ok(AdminRequest::RemoveNode { id: 2 })
        ));
        assert!(matches!(
            serde_json::from_str::<AdminRequest>(r#"{"command":"isolate","from":[1,3]}"#),
            Ok(AdminRequest::Isolate { from }) if from == [1, 3]
        ));
        assert!(matches!(
            serde_json::from_str::<AdminRequest>(r#"{"command":"reload"}"#),
            Ok(AdminRequest::Reload)
        ));
        for bad in [
            r#"{"command":"reboot"}"#,
            r#"{"command":"add-node"}"#,
            "[]",
            "nope",
        ] {
            assert!(serde_json::from_str::<AdminRequest>(bad).is_err(), "{bad}");
        }
    }
}
