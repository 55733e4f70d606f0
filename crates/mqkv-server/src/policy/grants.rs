//! One client's grants: the rules that name it, with its client id, user name and attributes
//! filled in.

use std::sync::Arc;

use mqkv_broker::access::{Grants, Principal, Subscription};
use mqkv_broker::topic;
use mqkv_protocol::GlobPattern;

use super::file::{BrokerMethod, BrokerResource, Key, Principals, Rule};
use super::template::{escape_glob, Part, Template};

/// How a granted key is matched.
#[derive(Debug, Clone)]
enum KeyMatch {
    Exact(Vec<u8>),
    Glob(GlobPattern),
}

impl KeyMatch {
    fn matches(&self, key: &[u8]) -> bool {
        match self {
            KeyMatch::Exact(k) => k == key,
            KeyMatch::Glob(g) => g.matches(key),
        }
    }
}

/// What one client may do.
#[derive(Debug, Default)]
pub struct ClientGrants {
    connect: bool,
    publish: Vec<String>,
    /// Filters, each for subscriptions of any kind or, with a group, shared ones in it.
    subscribe: Vec<(Option<String>, String)>,
    read: Vec<KeyMatch>,
    write: Vec<KeyMatch>,
}

/// Text in which only `*` is a wildcard, as a glob.
fn star_glob(text: &str) -> String {
    text.split('*')
        .map(|s| escape_glob(s).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("*")
}

/// A client id pattern (`*` matches any run of characters, tokens filled in) as a glob in
/// which token values and other metacharacters are taken literally.
fn client_id_glob(template: &Template, client_id: &str, principal: &Principal) -> Option<String> {
    let literal = Template {
        parts: template
            .parts
            .iter()
            .map(|part| match part {
                Part::Text(t) => Part::Text(star_glob(t)),
                token => token.clone(),
            })
            .collect(),
    };
    literal.fill(client_id, principal, escape_glob)
}

/// The matcher of a granted key for one client; `None` when a token has no value for it.
fn key_match(key: &Key, client_id: &str, principal: &Principal) -> Option<KeyMatch> {
    match key {
        Key::Binary(k) => Some(KeyMatch::Exact(k.clone())),
        Key::Exact(t) => t
            .fill(client_id, principal, |v| Some(v.to_owned()))
            .map(|k| KeyMatch::Exact(k.into_bytes())),
        Key::Pattern(t) => t
            .fill(client_id, principal, escape_glob)
            .map(|p| KeyMatch::Glob(GlobPattern::new(p.as_bytes()))),
    }
}

fn glob_matches(pattern: &str, text: &str) -> bool {
    GlobPattern::new(pattern.as_bytes()).matches(text.as_bytes())
}

/// Whether `principals` name this client.
fn names(principals: &Principals, client_id: &str, principal: &Principal) -> bool {
    let by_id = principals
        .client_ids
        .iter()
        .any(|p| glob_matches(&star_glob(p), client_id));
    let by_name = principal
        .username
        .as_deref()
        .is_some_and(|u| principals.usernames.iter().any(|n| n == u));
    let by_attributes = principals.attributes.iter().any(|set| {
        !set.is_empty()
            && set
                .iter()
                .all(|(k, v)| principal.attribute(k) == Some(v.0.as_str()))
    });
    by_id || by_name || by_attributes
}

/// Whether a broker entry applies to this client id.
fn entry_applies(entry: &BrokerResource, client_id: &str, principal: &Principal) -> bool {
    entry.client_ids.is_empty()
        || entry.client_ids.iter().any(|t| {
            client_id_glob(t, client_id, principal).is_some_and(|g| glob_matches(&g, client_id))
        })
}

impl ClientGrants {
    /// The grants `rules` give the client `client_id` authenticated as `principal`.
    pub fn resolve(rules: &[Rule], client_id: &str, principal: &Principal) -> ClientGrants {
        let mut g = ClientGrants::default();
        for rule in rules
            .iter()
            .filter(|r| names(&r.principals, client_id, principal))
        {
            for entry in &rule.broker_resources {
                if !entry_applies(entry, client_id, principal) {
                    continue;
                }
                let filters = entry
                    .topics
                    .iter()
                    .filter_map(|t| t.fill(client_id, principal));
                match entry.method {
                    BrokerMethod::Connect => g.connect = true,
                    BrokerMethod::Publish => g.publish.extend(filters),
                    BrokerMethod::Subscribe => g.subscribe.extend(filters.filter_map(|f| {
                        let spec = topic::parse_filter(&f)?;
                        Some((spec.group.map(str::to_owned), spec.filter.to_owned()))
                    })),
                }
            }
            for entry in &rule.state_store_resources {
                for key in &entry.keys {
                    let Some(matcher) = key_match(key, client_id, principal) else {
                        continue;
                    };
                    if entry.method.writes() {
                        g.write.push(matcher.clone());
                    }
                    if entry.method.reads() {
                        g.read.push(matcher);
                    }
                }
            }
        }
        g.publish.sort();
        g.publish.dedup();
        g.subscribe.sort();
        g.subscribe.dedup();
        g
    }

    pub fn into_arc(self) -> Arc<dyn Grants> {
        Arc::new(self)
    }
}

impl Grants for ClientGrants {
    fn may_connect(&self) -> bool {
        self.connect
    }

    fn may_publish(&self, t: &str) -> bool {
        self.publish.iter().any(|f| topic::matches(f, t))
    }

    fn subscription(&self, group: Option<&str>, filter: &str) -> Subscription {
        let for_group = |only: &Option<String>| only.as_deref().is_none_or(|o| Some(o) == group);
        if self
            .subscribe
            .iter()
            .any(|(only, f)| for_group(only) && topic::covers(f, filter))
        {
            return Subscription::Whole;
        }
        // A shared subscription is allowed whole or not at all: a message its group gets is
        // given to one member, which must be allowed to receive it.
        let partly = group.is_none()
            && self
                .subscribe
                .iter()
                .any(|(only, f)| only.is_none() && topic::intersects(f, filter));
        if partly {
            Subscription::Partly
        } else {
            Subscription::Denied
        }
    }

    fn may_receive(&self, t: &str) -> bool {
        self.subscribe
            .iter()
            .any(|(only, f)| only.is_none() && topic::matches(f, t))
    }

    fn may_use(&self, resource: &[u8], write: bool) -> bool {
        let list = if write { &self.write } else { &self.read };
        list.iter().any(|k| k.matches(resource))
    }
}
