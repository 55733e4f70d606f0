//! The live feed: a viewer picks keys, the dashboard observes them with KEYNOTIFY requests
//! made as that viewer (so the policy, the observation quota and the key length limit apply
//! as for any client), and each change comes to the page as a server-sent event.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use mqkv_broker::ClientIdentity;
use mqkv_protocol::{Command, Response};
use mqkv_store::{ChangeEvent, ChangeKind};
use serde_json::json;
use tokio::sync::mpsc;

use super::{shown, Dashboard};
use crate::statestore::Notifier;

/// Most keys one feed observes.
pub const MAX_KEYS: usize = 64;

/// Changes a feed holds for a page that reads slowly; more are dropped for it.
const BACKLOG: usize = 1024;

/// Ends the feed's observations when the page goes away (its stream is dropped).
struct Observing {
    notifier: Arc<Notifier>,
    identity: ClientIdentity,
}

impl Drop for Observing {
    fn drop(&mut self) {
        self.notifier.detach_local(&self.identity);
    }
}

/// Observes `keys` as `identity` and streams their changes.
pub async fn feed(
    d: Arc<Dashboard>,
    identity: ClientIdentity,
    keys: Vec<String>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    d.notifier.attach_local(identity.client_id.clone(), tx);
    let observing = Observing {
        notifier: d.notifier.clone(),
        identity: identity.clone(),
    };
    let mut first = Vec::new();
    for key in keys.into_iter().take(MAX_KEYS) {
        let command = Command::KeyNotify {
            key: Bytes::from(key.clone()),
            stop: false,
        };
        let answer = d.service.local_request(&command, identity.clone()).await;
        let event = match answer {
            Ok((Response::Ok, _)) => json!({"kind": "observing", "key": key}),
            Ok((other, _)) => json!({"kind": "refused", "key": key, "error": answer_text(&other)}),
            Err(e) => json!({"kind": "refused", "key": key, "error": e}),
        };
        first.push(Ok(Event::default().data(event.to_string())));
    }
    let changes = stream::unfold((rx, observing), |(mut rx, observing)| async move {
        let change = rx.recv().await?;
        Some((
            Ok(Event::default().data(change_json(&change))),
            (rx, observing),
        ))
    });
    Sse::new(futures_util::StreamExt::chain(stream::iter(first), changes))
        .keep_alive(KeepAlive::default())
}

fn answer_text(response: &Response) -> String {
    String::from_utf8_lossy(&response.encode())
        .trim_end()
        .to_owned()
}

/// One change as the page reads it.
fn change_json(change: &ChangeEvent) -> String {
    let key = shown(&change.key);
    let body = match &change.kind {
        ChangeKind::Set { value } => json!({
            "kind": "set",
            "key": key,
            "value": shown(value),
            "version": change.version.to_text(),
        }),
        ChangeKind::Delete => json!({
            "kind": "delete",
            "key": key,
            "version": change.version.to_text(),
        }),
    };
    body.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqkv_protocol::Hlc;

    #[test]
    fn a_change_is_shown_as_text_or_hex() {
        let set = ChangeEvent {
            key: Bytes::from_static(b"k"),
            kind: ChangeKind::Set {
                value: Bytes::from_static(b"\x00\x01"),
            },
            version: Hlc::new(5, 1, "n"),
        };
        let v: serde_json::Value = serde_json::from_str(&change_json(&set)).expect("json");
        assert_eq!(v["kind"], "set");
        assert_eq!(v["key"]["text"], "k");
        assert_eq!(v["value"]["text"], serde_json::Value::Null);
        assert_eq!(v["value"]["hex"], "0001");
        assert_eq!(v["version"], Hlc::new(5, 1, "n").to_text());
    }
}
