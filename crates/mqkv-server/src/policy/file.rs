//! The policy file: AIO's `BrokerAuthorization` resource as it is, or just its list of rules.
//!
//! Everything is checked while the YAML is read, so an error carries the line it is on.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::template::{Template, TopicTemplate};

/// A whole policy file: its rules.
#[derive(Debug, Default)]
pub struct PolicyFile {
    pub rules: Vec<Rule>,
}

/// One rule: who it is for, and what they may do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rule {
    pub principals: Principals,
    #[serde(default)]
    pub broker_resources: Vec<BrokerResource>,
    #[serde(default)]
    pub state_store_resources: Vec<StateStoreResource>,
}

/// Who a rule is for: any listed client id, user name or attribute set matches.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Principals {
    /// Client ids; `*` matches any run of characters.
    #[serde(default)]
    pub client_ids: Vec<String>,
    #[serde(default)]
    pub usernames: Vec<String>,
    /// Attribute sets: a set matches a client that has every attribute in it, with that value.
    #[serde(default)]
    pub attributes: Vec<BTreeMap<String, Scalar>>,
}

/// A YAML scalar taken as text (`building: 17` is the text `17`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a text, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum BrokerMethod {
    Connect,
    Publish,
    Subscribe,
}

/// What a rule allows on the broker.
#[derive(Debug)]
pub struct BrokerResource {
    pub method: BrokerMethod,
    /// Topics (filters for Subscribe); none for Connect.
    pub topics: Vec<TopicTemplate>,
    /// Client ids the entry is limited to (`*` matches any run of characters; tokens
    /// allowed); empty: any.
    pub client_ids: Vec<Template>,
}

impl<'de> Deserialize<'de> for BrokerResource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<BrokerResource, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Raw {
            method: BrokerMethod,
            #[serde(default)]
            topics: Option<Vec<String>>,
            #[serde(default)]
            client_ids: Vec<String>,
        }
        let raw = Raw::deserialize(d)?;
        let topics = match (raw.method, raw.topics) {
            (BrokerMethod::Connect, Some(_)) => {
                return Err(de::Error::custom("a Connect entry takes no topics"))
            }
            (BrokerMethod::Connect, None) => Vec::new(),
            (_, None) => return Err(de::Error::custom("Publish and Subscribe need topics")),
            (_, Some(t)) if t.is_empty() => {
                return Err(de::Error::custom("Publish and Subscribe need topics"))
            }
            (_, Some(t)) => t
                .iter()
                .map(|t| TopicTemplate::parse(t))
                .collect::<Result<_, _>>()
                .map_err(de::Error::custom)?,
        };
        let client_ids = raw
            .client_ids
            .iter()
            .map(|c| Template::parse(c))
            .collect::<Result<_, _>>()
            .map_err(de::Error::custom)?;
        Ok(BrokerResource {
            method: raw.method,
            topics,
            client_ids,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum StoreMethod {
    Read,
    Write,
    ReadWrite,
}

impl StoreMethod {
    pub fn reads(self) -> bool {
        matches!(self, StoreMethod::Read | StoreMethod::ReadWrite)
    }

    pub fn writes(self) -> bool {
        matches!(self, StoreMethod::Write | StoreMethod::ReadWrite)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum KeyType {
    Pattern,
    String,
    Binary,
}

/// A key a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A glob, with tokens.
    Pattern(Template),
    /// An exact key, with tokens.
    Exact(Template),
    /// An exact key given in base64.
    Binary(Vec<u8>),
}

/// What a rule allows in the state store.
#[derive(Debug)]
pub struct StateStoreResource {
    pub method: StoreMethod,
    pub keys: Vec<Key>,
}

impl<'de> Deserialize<'de> for StateStoreResource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StateStoreResource, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Raw {
            method: StoreMethod,
            key_type: KeyType,
            keys: Vec<String>,
        }
        let raw = Raw::deserialize(d)?;
        if raw.keys.is_empty() {
            return Err(de::Error::custom("keys must name at least one key"));
        }
        let mut keys = Vec::with_capacity(raw.keys.len());
        for k in &raw.keys {
            if k.is_empty() {
                return Err(de::Error::custom("an empty key"));
            }
            keys.push(match raw.key_type {
                KeyType::Pattern => Key::Pattern(Template::parse(k).map_err(de::Error::custom)?),
                KeyType::String => Key::Exact(Template::parse(k).map_err(de::Error::custom)?),
                KeyType::Binary => Key::Binary(
                    base64::engine::general_purpose::STANDARD
                        .decode(k)
                        .map_err(|e| de::Error::custom(format!("'{k}' is not base64: {e}")))?,
                ),
            });
        }
        Ok(StateStoreResource {
            method: raw.method,
            keys,
        })
    }
}

/// `spec:` of the resource.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    authorization_policies: AuthorizationPolicies,
}

/// `spec.authorizationPolicies:` of the resource.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorizationPolicies {
    /// AIO's decision cache; mqkv works its decisions out once per connection anyway.
    #[serde(default)]
    #[allow(dead_code)]
    cache: Option<IgnoredAny>,
    rules: Vec<Rule>,
}

impl<'de> Deserialize<'de> for PolicyFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PolicyFile, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PolicyFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a BrokerAuthorization resource or a list of rules")
            }
            fn visit_unit<E: de::Error>(self) -> Result<PolicyFile, E> {
                Ok(PolicyFile::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PolicyFile, A::Error> {
                let mut rules = Vec::new();
                while let Some(rule) = seq.next_element()? {
                    rules.push(rule);
                }
                Ok(PolicyFile { rules })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PolicyFile, A::Error> {
                let mut rules = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "apiVersion" | "metadata" => {
                            map.next_value::<IgnoredAny>()?;
                        }
                        "kind" => {
                            let kind: String = map.next_value()?;
                            if kind != "BrokerAuthorization" {
                                return Err(de::Error::custom(format!(
                                    "kind is {kind}, not BrokerAuthorization"
                                )));
                            }
                        }
                        "spec" => {
                            let spec: Spec = map.next_value()?;
                            rules = Some(spec.authorization_policies.rules);
                        }
                        "authorizationPolicies" => {
                            let p: AuthorizationPolicies = map.next_value()?;
                            rules = Some(p.rules);
                        }
                        "rules" => rules = Some(map.next_value()?),
                        other => {
                            return Err(de::Error::unknown_field(
                                other,
                                &[
                                    "apiVersion",
                                    "kind",
                                    "metadata",
                                    "spec",
                                    "authorizationPolicies",
                                    "rules",
                                ],
                            ))
                        }
                    }
                }
                let rules = rules.ok_or_else(|| de::Error::missing_field("spec"))?;
                Ok(PolicyFile { rules })
            }
        }
        d.deserialize_any(V)
    }
}
