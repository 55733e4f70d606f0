//! A raw state store client over `rumqttc`, for tests that control every byte.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};

use super::TIMEOUT;

pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

pub fn ts(ms: u64) -> String {
    format!("{ms:015}:00000:test-client")
}

/// Encodes a RESP3 array of bulk strings.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

pub struct Client {
    pub id: String,
    pub client: AsyncClient,
    pub el: EventLoop,
    next: u64,
    /// Messages that arrived while waiting for something else.
    stash: Vec<Publish>,
}

pub struct Answer {
    pub payload: Bytes,
    pub props: PublishProperties,
}

impl Answer {
    pub fn user(&self, name: &str) -> Option<&str> {
        self.props
            .user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    pub async fn connect(id: &str, port: u16) -> Client {
        Self::connect_with(id, port, |_| {}).await
    }

    /// `connect` with an owned id, for a task of its own.
    pub async fn connect_owned(id: String, port: u16) -> Client {
        Self::connect(&id, port).await
    }

    /// `connect` with extra MQTT options (session expiry, clean start, ...).
    pub async fn connect_with(id: &str, port: u16, tune: impl FnOnce(&mut MqttOptions)) -> Client {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(10));
        tune(&mut o);
        o.set_max_packet_size(Some(64 * 1024 * 1024));
        let (client, mut el) = AsyncClient::new(o, 100);
        let response = format!("clients/{id}/response");
        client.subscribe(&response, QoS::AtLeastOnce).await.unwrap();
        tokio::time::timeout(TIMEOUT, async {
            loop {
                if let Event::Incoming(Packet::SubAck(_)) = el.poll().await.unwrap() {
                    break;
                }
            }
        })
        .await
        .unwrap();
        Client {
            id: id.into(),
            client,
            el,
            // Correlation data is unique across clients and runs, as the SDKs' UUIDs are.
            next: rand::random::<u64>() >> 1,
            stash: Vec::new(),
        }
    }

    pub fn correlation(&mut self) -> Bytes {
        self.next += 1;
        Bytes::from(self.next.to_be_bytes().repeat(2))
    }

    pub async fn send(
        &mut self,
        payload: Vec<u8>,
        user: Vec<(String, String)>,
        correlation: Bytes,
    ) {
        let props = PublishProperties {
            response_topic: Some(format!("clients/{}/response", self.id)),
            correlation_data: Some(correlation),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".into()),
            user_properties: user,
            ..Default::default()
        };
        self.client
            .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, payload, props)
            .await
            .unwrap();
    }

    pub async fn wait_response(&mut self, correlation: &Bytes) -> Answer {
        let want = correlation.clone();
        let got = self
            .wait_for(|p| {
                p.properties
                    .as_ref()
                    .and_then(|x| x.correlation_data.as_ref())
                    == Some(&want)
            })
            .await;
        Answer {
            payload: got.payload,
            props: got.properties.unwrap_or_default(),
        }
    }

    pub async fn wait_for(&mut self, pred: impl Fn(&Publish) -> bool) -> Publish {
        if let Some(i) = self.stash.iter().position(&pred) {
            return self.stash.remove(i);
        }
        tokio::time::timeout(TIMEOUT, async {
            loop {
                if let Event::Incoming(Packet::Publish(p)) = self.el.poll().await.expect("poll") {
                    if pred(&p) {
                        return p;
                    }
                    self.stash.push(p);
                }
            }
        })
        .await
        .expect("message in time")
    }

    /// Like `call`, but a lost connection or a missing answer is `None` instead of a panic.
    pub async fn try_call(&mut self, args: &[&[u8]]) -> Option<Answer> {
        let c = self.correlation();
        let props = PublishProperties {
            response_topic: Some(format!("clients/{}/response", self.id)),
            correlation_data: Some(c.clone()),
            message_expiry_interval: Some(10),
            user_properties: vec![("__ts".into(), ts(now_ms()))],
            ..Default::default()
        };
        self.client
            .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, resp(args), props)
            .await
            .ok()?;
        let got = tokio::time::timeout(TIMEOUT, async {
            loop {
                match self.el.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if p.properties
                            .as_ref()
                            .and_then(|x| x.correlation_data.as_ref())
                            == Some(&c)
                        {
                            return Some(p);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        })
        .await
        .ok()??;
        Some(Answer {
            payload: got.payload,
            props: got.properties.unwrap_or_default(),
        })
    }

    /// A request with `__ts` = now, like the SDKs send.
    pub async fn call(&mut self, args: &[&[u8]]) -> Answer {
        self.call_with(resp(args), vec![("__ts".into(), ts(now_ms()))])
            .await
    }

    pub async fn call_with(&mut self, payload: Vec<u8>, user: Vec<(String, String)>) -> Answer {
        let c = self.correlation();
        self.send(payload, user, c.clone()).await;
        self.wait_response(&c).await
    }

    /// Polls briefly and returns everything that arrived.
    pub async fn drain(&mut self, for_: Duration) -> Vec<Publish> {
        let mut out = std::mem::take(&mut self.stash);
        while let Ok(Ok(ev)) = tokio::time::timeout(for_, self.el.poll()).await {
            if let Event::Incoming(Packet::Publish(p)) = ev {
                out.push(p);
            }
        }
        out
    }
}
