//! Text with `{principal.*}` tokens, filled in for one client.
//!
//! Tokens: `{principal.clientId}`, `{principal.username}` and `{principal.attributes.NAME}`. In
//! a topic a token must be a whole level (`clients/{principal.clientId}/#`); in a state store key
//! pattern it may sit anywhere (`clients:{principal.clientId}:*`).

use mqkv_broker::access::Principal;

/// One `{principal.*}` token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    ClientId,
    Username,
    Attribute(String),
}

impl Token {
    /// The token named inside the braces of `{...}`.
    fn parse(inner: &str) -> Result<Token, String> {
        match inner {
            "principal.clientId" => Ok(Token::ClientId),
            "principal.username" => Ok(Token::Username),
            _ => match inner.strip_prefix("principal.attributes.") {
                Some(name) if !name.is_empty() => Ok(Token::Attribute(name.to_owned())),
                _ => Err(format!(
                    "unknown token {{{inner}}}: use {{principal.clientId}}, {{principal.username}} or {{principal.attributes.NAME}}"
                )),
            },
        }
    }

    /// The token's value for a client; `None` when it has none (an anonymous client's user
    /// name, an attribute it lacks).
    pub fn value<'a>(&self, client_id: &'a str, principal: &'a Principal) -> Option<&'a str> {
        match self {
            Token::ClientId => Some(client_id),
            Token::Username => principal.username.as_deref(),
            Token::Attribute(name) => principal.attribute(name),
        }
    }
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Token(Token),
}

/// Text with tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub parts: Vec<Part>,
}

impl Template {
    /// Splits `text` into text and tokens. A `{` that does not start a `{principal.` token is
    /// refused, so that a misspelt token is not taken for text.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("'{{' without '}}' in '{text}'"))?;
            parts.push(Part::Token(Token::parse(&after[..close])?));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// Whether it holds any token.
    pub fn has_tokens(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Token(_)))
    }

    /// The text with every token replaced by `escape(value)`; `None` when a token has no
    /// value for this client or `escape` refuses one.
    pub fn fill(
        &self,
        client_id: &str,
        principal: &Principal,
        escape: impl Fn(&str) -> Option<String>,
    ) -> Option<String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Token(token) => out.push_str(&escape(token.value(client_id, principal)?)?),
            }
        }
        Some(out)
    }
}

/// A topic or topic filter whose tokens are whole levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate(pub Template);

impl TopicTemplate {
    /// Checks `text` as a topic filter with tokens as whole levels.
    pub fn parse(text: &str) -> Result<TopicTemplate, String> {
        if text.is_empty() {
            return Err("an empty topic".into());
        }
        let template = Template::parse(text)?;
        // Every level is plain text or exactly one token.
        for level in text.split('/') {
            if level.contains('{') && !(level.starts_with('{') && level.ends_with('}')) {
                return Err(format!(
                    "a token must be a whole topic level: '{level}' in '{text}'"
                ));
            }
            if level.matches('{').count() > 1 {
                return Err(format!(
                    "a token must be a whole topic level: '{level}' in '{text}'"
                ));
            }
        }
        // With the tokens as one-character stand-ins, the rest must be a valid filter.
        let stand_in: String = template
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::Token(_) => "x",
            })
            .collect();
        if !mqkv_broker::topic::valid_topic_filter(&stand_in) {
            return Err(format!("'{text}' is not a valid topic filter"));
        }
        Ok(TopicTemplate(template))
    }

    /// The filter for one client; `None` when a token has no value or its value is not a
    /// single topic level (empty, or holding `/`, `+` or `#`).
    pub fn fill(&self, client_id: &str, principal: &Principal) -> Option<String> {
        self.0.fill(client_id, principal, |v| {
            let level_safe = !v.is_empty() && !v.contains(['/', '+', '#']);
            level_safe.then(|| v.to_owned())
        })
    }
}

/// Escapes glob metacharacters, so that a token's value in a key pattern matches only itself.
pub fn escape_glob(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '*' => out.push_str("[*]"),
            '?' => out.push_str("[?]"),
            '[' => out.push_str("[[]"),
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        let mut p = Principal::user("alice");
        p.set_attribute("organization", "contoso");
        p
    }

    #[test]
    fn topic_tokens_are_whole_levels() {
        let t = TopicTemplate::parse("clients/{principal.clientId}/#").expect("valid");
        assert_eq!(
            t.fill("dev-1", &alice()).as_deref(),
            Some("clients/dev-1/#")
        );
        let t = TopicTemplate::parse("{principal.attributes.organization}/+/x").expect("valid");
        assert_eq!(t.fill("d", &alice()).as_deref(), Some("contoso/+/x"));
        for bad in [
            "client-{principal.clientId}/#",
            "a/{principal.clientId}x",
            "a/{principal.clientId}{principal.username}",
            "a/{principal.nothing}",
            "a/{principal.attributes.}",
            "a/{principal.clientId",
            "a/#/b",
            "a/b+",
            "",
        ] {
            assert!(TopicTemplate::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_value_that_is_not_one_level_fills_nothing() {
        let t = TopicTemplate::parse("clients/{principal.clientId}/#").expect("valid");
        for id in ["a/b", "+", "#", ""] {
            assert_eq!(t.fill(id, &alice()), None, "{id}");
        }
        let t = TopicTemplate::parse("u/{principal.username}").expect("valid");
        assert_eq!(t.fill("c", &Principal::default()), None);
        let t = TopicTemplate::parse("o/{principal.attributes.city}").expect("valid");
        assert_eq!(t.fill("c", &alice()), None);
    }

    #[test]
    fn key_tokens_sit_anywhere_and_are_escaped() {
        let t = Template::parse("clients:{principal.clientId}:*").expect("valid");
        assert!(t.has_tokens());
        assert_eq!(
            t.fill("a*b?[", &alice(), escape_glob).as_deref(),
            Some("clients:a[*]b[?][[]:*")
        );
        assert!(!Template::parse("plain").expect("valid").has_tokens());
        assert!(Template::parse("x{principal.bogus}").is_err());
    }
}
