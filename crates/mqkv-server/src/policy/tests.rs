use mqkv_broker::access::{Grants, Principal, Subscription};

use super::Policy;

const RESOURCE: &str = r#"
apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata:
  name: my-authz-policies
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      - principals:
          clientIds: ["temperature-sensor", "humidity-sensor"]
          usernames: ["alice"]
          attributes:
            - city: seattle
              organization: contoso
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ["/telemetry/{principal.clientId}", "/telemetry/{principal.attributes.organization}"]
          - method: Subscribe
            topics: ["/commands/{principal.attributes.organization}"]
        stateStoreResources:
          - method: Read
            keyType: Pattern
            keys: ["myreadkey", "myotherkey?", "mynumerickeysuffix[0-9]", "clients:{principal.clientId}:*"]
          - method: ReadWrite
            keyType: Binary
            keys: ["eHh4"]
"#;

fn attrs(pairs: &[(&str, &str)]) -> Principal {
    let mut p = Principal::default();
    for (k, v) in pairs {
        p.set_attribute(k, v);
    }
    p
}

#[test]
fn the_aio_resource_is_taken_as_it_is() {
    let policy = Policy::parse(RESOURCE).expect("valid");
    assert_eq!(policy.rule_count(), 1);
    // Named by client id.
    let g = policy.client_grants("temperature-sensor", &Principal::default());
    assert!(g.may_connect());
    assert!(g.may_publish("/telemetry/temperature-sensor"));
    assert!(!g.may_publish("/telemetry/humidity-sensor"));
    // No organization attribute: that topic names nothing for it.
    assert_ne!(
        g.subscription(None, "/commands/contoso"),
        Subscription::Whole
    );
    assert!(g.may_use(b"myreadkey", false));
    assert!(!g.may_use(b"myreadkey", true));
    assert!(g.may_use(b"myotherkey1", false));
    assert!(g.may_use(b"mynumerickeysuffix7", false));
    assert!(!g.may_use(b"mynumerickeysuffixx", false));
    assert!(g.may_use(b"clients:temperature-sensor:a", false));
    assert!(!g.may_use(b"clients:humidity-sensor:a", false));
    assert!(g.may_use(b"xxx", true));
    assert!(g.may_use(b"xxx", false));
    // Named by a whole attribute set only.
    let g = policy.client_grants(
        "fan-1",
        &attrs(&[("city", "seattle"), ("organization", "contoso")]),
    );
    assert!(g.may_connect());
    assert!(g.may_publish("/telemetry/contoso"));
    assert_eq!(
        g.subscription(None, "/commands/contoso"),
        Subscription::Whole
    );
    let g = policy.client_grants("fan-1", &attrs(&[("city", "seattle")]));
    assert!(!g.may_connect());
    // Named by user name.
    let g = policy.client_grants("x", &Principal::user("alice"));
    assert!(g.may_connect());
    assert!(!policy
        .client_grants("x", &Principal::user("bob"))
        .may_connect());
}

#[test]
fn a_bare_list_of_rules_is_a_policy_too() {
    let policy = Policy::parse(
        r#"
- principals: { usernames: [alice] }
  brokerResources:
    - method: Connect
    - method: Subscribe
      topics: ["sensors/#", "alerts/{principal.username}/+"]
"#,
    )
    .expect("valid");
    let g = policy.client_grants("c", &Principal::user("alice"));
    assert_eq!(g.subscription(None, "sensors/#"), Subscription::Whole);
    assert_eq!(g.subscription(None, "sensors/+/temp"), Subscription::Whole);
    assert_eq!(g.subscription(None, "alerts/alice/x"), Subscription::Whole);
    assert_eq!(g.subscription(None, "alerts/alice/+"), Subscription::Whole);
    assert_eq!(g.subscription(None, "alerts/bob/+"), Subscription::Denied);
    // Wider than the grants: made, and filtered message by message.
    assert_eq!(g.subscription(None, "#"), Subscription::Partly);
    assert_eq!(g.subscription(None, "alerts/#"), Subscription::Partly);
    assert!(g.may_receive("alerts/alice/x"));
    assert!(!g.may_receive("alerts/bob/x"));
    // Nothing in common with them: refused.
    assert_eq!(g.subscription(None, "other/#"), Subscription::Denied);
    assert!(!g.may_publish("sensors/a"));
    // A plain filter allows shared subscriptions to it in any group.
    assert_eq!(
        g.subscription(Some("any"), "sensors/#"),
        Subscription::Whole
    );
}

#[test]
fn a_shared_filter_allows_its_group_only() {
    let policy = Policy::parse(
        r#"
- principals: { usernames: [w] }
  brokerResources:
    - method: Subscribe
      topics: ["$share/workers/jobs/#"]
"#,
    )
    .expect("valid");
    let g = policy.client_grants("c", &Principal::user("w"));
    assert_eq!(
        g.subscription(Some("workers"), "jobs/a"),
        Subscription::Whole
    );
    assert_eq!(
        g.subscription(Some("others"), "jobs/a"),
        Subscription::Denied
    );
    assert_eq!(g.subscription(None, "jobs/a"), Subscription::Denied);
}

#[test]
fn connect_entries_may_limit_client_ids() {
    let policy = Policy::parse(
        r#"
- principals: { attributes: [{ building: "17" }] }
  brokerResources:
    - method: Connect
      clientIds: ["{principal.attributes.building}-*"]
"#,
    )
    .expect("valid");
    let p = attrs(&[("building", "17")]);
    assert!(policy.client_grants("17-fan", &p).may_connect());
    assert!(!policy.client_grants("18-fan", &p).may_connect());
}

#[test]
fn numbers_in_attributes_are_text() {
    let policy = Policy::parse(
        "- principals: { attributes: [{ building: 17, on: true }] }\n  brokerResources: [{ method: Connect }]\n",
    )
    .expect("valid");
    assert!(policy
        .client_grants("c", &attrs(&[("building", "17"), ("on", "true")]))
        .may_connect());
}

#[test]
fn token_values_are_literal_in_key_patterns() {
    let policy = Policy::parse(
        r#"
- principals: { clientIds: ["*"] }
  stateStoreResources:
    - method: ReadWrite
      keyType: Pattern
      keys: ["own:{principal.clientId}:*"]
    - method: Write
      keyType: String
      keys: ["exact-{principal.clientId}*"]
"#,
    )
    .expect("valid");
    let g = policy.client_grants("a*", &Principal::default());
    assert!(g.may_use(b"own:a*:k", true));
    // The client id's `*` is not a wildcard.
    assert!(!g.may_use(b"own:abc:k", true));
    // A String key is exact, its `*` included.
    assert!(g.may_use(b"exact-a**", true));
    assert!(!g.may_use(b"exact-a**", false));
    assert!(!g.may_use(b"exact-a*x", true));
}

#[test]
fn nothing_is_allowed_that_no_rule_allows() {
    let policy = Policy::parse("[]").expect("valid");
    let g = policy.client_grants("c", &Principal::user("alice"));
    assert!(!g.may_connect());
    assert!(!g.may_publish("a"));
    assert_ne!(g.subscription(None, "a"), Subscription::Whole);
    assert!(!g.may_use(b"k", false));
}

#[test]
fn mistakes_are_refused_with_their_line() {
    let cases = [
        (
            "- principals: { usernames: [a] }\n  brokerResources:\n    - method: Publish\n      topics: [\"client-{principal.clientId}/#\"]\n",
            "whole topic level",
            3,
        ),
        (
            "- principals: { usernames: [a] }\n  brokerResources:\n    - method: Connect\n      topics: [a]\n",
            "no topics",
            3,
        ),
        (
            "- principals: { usernames: [a] }\n  brokerResources:\n    - method: Pub\n",
            "unknown variant",
            3,
        ),
        (
            "- principals: { usernames: [a] }\n  stateStoreResources:\n    - method: Read\n      keyType: Binary\n      keys: [\"***\"]\n",
            "not base64",
            3,
        ),
        (
            "- principals: { usernames: [a] }\n  brokerResources:\n    - method: Publish\n      topics: [\"a/{principal.nope}\"]\n",
            "unknown token",
            3,
        ),
        (
            "- principals: { usernames: [a] }\n  brokerResorces: []\n",
            "unknown field",
            2,
        ),
        ("- brokerResources: []\n", "principals", 1),
        // The document as a whole: no line to name.
        ("kind: Other\nspec: {}\n", "BrokerAuthorization", 0),
        ("- principals: {\n  usernames: [a\n", "", 2),
    ];
    for (text, why, line) in cases {
        let e = Policy::parse(text).expect_err(text);
        assert!(e.contains(why), "{text}: {e}");
        if line > 0 {
            assert!(e.contains(&format!("line {line}")), "{text}: {e}");
        }
    }
}

proptest::proptest! {
    /// A key pattern with the client id in it grants exactly the keys under that client's own
    /// prefix, whatever characters the id holds (glob metacharacters included).
    #[test]
    fn a_client_id_in_a_key_pattern_is_literal(
        id in "[a-c*?\\[\\]!-]{1,6}",
        other in "[a-c*?\\[\\]!-]{1,6}",
        suffix in "[a-z:*]{0,4}",
    ) {
        let policy = Policy::parse(
            "- principals: { clientIds: [\"*\"] }\n  stateStoreResources:\n    - method: Read\n      keyType: Pattern\n      keys: [\"own:{principal.clientId}:*\"]\n",
        ).expect("valid");
        let g = policy.client_grants(&id, &Principal::default());
        let own = format!("own:{id}:{suffix}");
        let theirs = format!("own:{other}:{suffix}");
        proptest::prop_assert!(g.may_use(own.as_bytes(), false));
        proptest::prop_assert!(!g.may_use(own.as_bytes(), true));
        proptest::prop_assert_eq!(
            g.may_use(theirs.as_bytes(), false),
            theirs.starts_with(&format!("own:{id}:"))
        );
    }

    /// A topic with the client id as a level grants the client's own subtree only, and nothing
    /// when the id is not a single level.
    #[test]
    fn a_client_id_in_a_topic_is_one_level(
        id in "[a-c+#/]{0,5}",
        other in "[a-c]{1,5}",
        rest in "[a-c]{1,3}",
    ) {
        let policy = Policy::parse(
            "- principals: { clientIds: [\"*\"] }\n  brokerResources:\n    - method: Publish\n      topics: [\"t/{principal.clientId}/#\"]\n",
        ).expect("valid");
        let g = policy.client_grants(&id, &Principal::default());
        let single_level = !id.is_empty() && !id.contains(['/', '+', '#']);
        let own = format!("t/{id}/{rest}");
        proptest::prop_assert_eq!(g.may_publish(&own), single_level);
        if other != id {
            let theirs = format!("t/{other}/{rest}");
            proptest::prop_assert!(!g.may_publish(&theirs));
        }
    }
}
