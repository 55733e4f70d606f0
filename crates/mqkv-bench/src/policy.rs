//! The authorization policy of the `policy` workload: 100 rules, as a site with many devices
//! and applications might have. 99 rules name other principals (users, attributes); one names
//! the benchmark's clients by client id, with the topics and keys they use at the end of
//! lists of others, so every check walks past the rest.

use std::fmt::Write;

/// The request topic of the state store.
const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// The policy's YAML text.
pub fn yaml() -> String {
    let mut out = String::new();
    for n in 0..99 {
        let principals = match n % 3 {
            0 => format!("usernames: [\"user-{n}\", \"operator-{n}\"]"),
            1 => format!("attributes: [{{ site: \"site-{n}\", role: device }}]"),
            _ => format!("clientIds: [\"gateway-{n}-*\"]"),
        };
        let _ = write!(
            out,
            "- principals: {{ {principals} }}\n  \
             brokerResources:\n    \
             - method: Connect\n    \
             - method: Publish\n      \
             topics: [\"site-{n}/telemetry/{{principal.clientId}}/#\", \"site-{n}/events/+\"]\n    \
             - method: Subscribe\n      \
             topics: [\"site-{n}/commands/{{principal.clientId}}/#\", \"site-{n}/config/#\"]\n  \
             stateStoreResources:\n    \
             - method: ReadWrite\n      \
             keyType: Pattern\n      \
             keys: [\"site-{n}:{{principal.clientId}}:*\"]\n    \
             - method: Read\n      \
             keyType: String\n      \
             keys: [\"site-{n}-config\"]\n"
        );
    }
    let filler = |kind: &str| -> String {
        (0..8)
            .map(|i| format!("\"{kind}/{i}/{{principal.clientId}}/#\", "))
            .collect()
    };
    let _ = write!(
        out,
        "- principals: {{ clientIds: [\"bench-*\"] }}\n  \
         brokerResources:\n    \
         - method: Connect\n    \
         - method: Publish\n      \
         topics: [{}\"bench/ps/+\", \"{REQUEST_TOPIC}\"]\n    \
         - method: Subscribe\n      \
         topics: [{}\"bench/ps/+\", \"clients/{{principal.clientId}}/#\"]\n  \
         stateStoreResources:\n    \
         - method: ReadWrite\n      \
         keyType: Pattern\n      \
         keys: [\"own:{{principal.clientId}}:*\", \"shared:*\", \"bench-key-*\"]\n",
        filler("telemetry"),
        filler("commands"),
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hundred_rules() {
        let text = super::yaml();
        assert_eq!(text.matches("- principals:").count(), 100);
        assert!(text.contains("bench/ps/+"));
    }
}
