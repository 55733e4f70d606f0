//! What the server grants a connecting client: the parameters negotiated from its CONNECT and
//! the broker's limits, and the CONNACK properties that tell an MQTT 5 client about them.

use crate::codec::{self, Connect, Properties};
use crate::config::BrokerConfig;

/// The parameters a connection runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Granted {
    /// The session expiry interval the client asked for (MQTT 3.1.1: 0 for a clean session,
    /// never for a persistent one) and the one granted.
    pub requested_expiry: u32,
    pub expiry: u32,
    /// The keep alive in force, in seconds (0: none).
    pub keep_alive: u16,
    /// Set when the server chose the keep alive rather than the client.
    pub server_keep_alive: Option<u16>,
    /// What the client takes: publishes in flight, packet size, topic aliases.
    pub client_receive_max: u16,
    pub client_max_packet: usize,
    pub client_alias_max: u16,
}

pub(super) fn negotiate(connect: &Connect, cfg: &BrokerConfig) -> Granted {
    let requested_expiry = if connect.protocol_level == codec::V5 {
        connect.properties.session_expiry_interval.unwrap_or(0)
    } else if connect.clean_start {
        0
    } else {
        u32::MAX
    };
    let mut keep_alive = connect.keep_alive;
    let mut server_keep_alive = None;
    if cfg.max_keep_alive > 0 && (keep_alive == 0 || keep_alive > cfg.max_keep_alive) {
        keep_alive = cfg.max_keep_alive;
        server_keep_alive = Some(keep_alive);
    }
    Granted {
        requested_expiry,
        expiry: requested_expiry.min(cfg.max_session_expiry),
        keep_alive,
        server_keep_alive,
        client_receive_max: connect.properties.receive_maximum.unwrap_or(u16::MAX),
        client_max_packet: connect
            .properties
            .maximum_packet_size
            .map_or(usize::MAX, |v| v as usize),
        client_alias_max: connect.properties.topic_alias_maximum.unwrap_or(0),
    }
}

/// The properties of an MQTT 5 CONNACK: the server's limits, and what it changed of what the
/// client asked for. `assigned` is the client id the server chose for a client that sent none.
pub(super) fn connack_properties(
    granted: &Granted,
    connect: &Connect,
    cfg: &BrokerConfig,
    assigned: Option<String>,
    client_id: &str,
) -> Properties {
    let mut props = Properties::default();
    if assigned.is_some() {
        props.rare_mut().assigned_client_identifier = assigned;
    }
    props.server_keep_alive = granted.server_keep_alive;
    props.receive_maximum = Some(cfg.receive_maximum);
    props.maximum_packet_size = Some(cfg.max_packet_size);
    props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
    if granted.expiry != granted.requested_expiry {
        props.session_expiry_interval = Some(granted.expiry);
    }
    if connect.properties.request_response_information == Some(1) {
        let info = format!("clients/{client_id}");
        // Left out when a very long client id would make it too long to send.
        if info.len() <= codec::limits::MAX_FIELD {
            props.rare_mut().response_information = Some(info);
        }
    }
    props
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(level: u8, clean: bool, keep_alive: u16) -> Connect {
        Connect {
            protocol_level: level,
            clean_start: clean,
            ..Connect::v5("c", keep_alive)
        }
    }

    #[test]
    fn session_expiry_is_what_was_asked_within_the_limit() {
        let cfg = BrokerConfig {
            max_session_expiry: 3600,
            ..Default::default()
        };
        let mut c = connect(codec::V5, true, 30);
        assert_eq!(negotiate(&c, &cfg).expiry, 0);
        c.properties.session_expiry_interval = Some(60);
        assert_eq!(negotiate(&c, &cfg).expiry, 60);
        c.properties.session_expiry_interval = Some(u32::MAX);
        let g = negotiate(&c, &cfg);
        assert_eq!((g.requested_expiry, g.expiry), (u32::MAX, 3600));
        let props = connack_properties(&g, &c, &cfg, None, "c");
        assert_eq!(props.session_expiry_interval, Some(3600));
        // MQTT 3.1.1: a persistent session never expires, up to the limit.
        assert_eq!(
            negotiate(&connect(codec::V311, false, 30), &cfg).expiry,
            3600
        );
        assert_eq!(negotiate(&connect(codec::V311, true, 30), &cfg).expiry, 0);
    }

    #[test]
    fn the_server_sets_the_keep_alive_only_beyond_its_limit() {
        let cfg = BrokerConfig {
            max_keep_alive: 120,
            ..Default::default()
        };
        let g = negotiate(&connect(codec::V5, true, 60), &cfg);
        assert_eq!((g.keep_alive, g.server_keep_alive), (60, None));
        let g = negotiate(&connect(codec::V5, true, 0), &cfg);
        assert_eq!((g.keep_alive, g.server_keep_alive), (120, Some(120)));
        let g = negotiate(&connect(codec::V5, true, 600), &cfg);
        assert_eq!((g.keep_alive, g.server_keep_alive), (120, Some(120)));
        let unlimited = BrokerConfig {
            max_keep_alive: 0,
            ..Default::default()
        };
        let g = negotiate(&connect(codec::V5, true, 0), &unlimited);
        assert_eq!((g.keep_alive, g.server_keep_alive), (0, None));
    }

    #[test]
    fn the_clients_limits_are_taken_and_defaults_fill_the_rest() {
        let cfg = BrokerConfig::default();
        let mut c = connect(codec::V5, true, 30);
        let g = negotiate(&c, &cfg);
        assert_eq!(
            (
                g.client_receive_max,
                g.client_max_packet,
                g.client_alias_max
            ),
            (u16::MAX, usize::MAX, 0)
        );
        c.properties.receive_maximum = Some(5);
        c.properties.maximum_packet_size = Some(1000);
        c.properties.topic_alias_maximum = Some(7);
        let g = negotiate(&c, &cfg);
        assert_eq!(
            (
                g.client_receive_max,
                g.client_max_packet,
                g.client_alias_max
            ),
            (5, 1000, 7)
        );
    }

    #[test]
    fn connack_names_the_servers_limits_and_what_it_chose() {
        let cfg = BrokerConfig::default();
        let mut c = connect(codec::V5, true, 30);
        c.properties.request_response_information = Some(1);
        let g = negotiate(&c, &cfg);
        let props = connack_properties(&g, &c, &cfg, Some("mqkv-1".into()), "mqkv-1");
        assert_eq!(props.receive_maximum, Some(cfg.receive_maximum));
        assert_eq!(props.maximum_packet_size, Some(cfg.max_packet_size));
        assert_eq!(props.topic_alias_maximum, Some(cfg.topic_alias_maximum));
        assert_eq!(props.session_expiry_interval, None);
        let rare = props.rare.as_deref().expect("rare properties");
        assert_eq!(rare.assigned_client_identifier.as_deref(), Some("mqkv-1"));
        assert_eq!(rare.response_information.as_deref(), Some("clients/mqkv-1"));
        let long = "x".repeat(codec::limits::MAX_FIELD);
        let props = connack_properties(&g, &c, &cfg, None, &long);
        assert!(props
            .rare
            .as_deref()
            .is_none_or(|r| r.response_information.is_none()));
    }
}
