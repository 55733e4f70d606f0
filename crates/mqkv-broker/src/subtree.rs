//! The subscription index: a trie over topic levels.
//!
//! Matching a topic walks at most three branches per level (the exact level, `+` and `#`), so
//! routing cost depends on the topic's depth and the number of matching subscriptions, not on
//! how many subscriptions exist. Shared subscription groups sit beside plain subscribers at the
//! leaf of their filter; each group keeps a round-robin cursor so matching picks one member.

use std::collections::HashMap as StdHashMap;

use smallvec::SmallVec;

/// Topic levels and client ids come from clients: a seeded hasher, but a faster one than
/// SipHash, since every publish looks up one map per topic level.
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::codec::SubscriptionOptions;

pub type ClientId = Arc<str>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubEntry {
    pub options: SubscriptionOptions,
    pub identifier: Option<u32>,
    /// The subscriber may receive only some of the topics the filter matches: each message is
    /// checked against its grants before delivery (see [`crate::access`]).
    pub filtered: bool,
}

/// A subscriber as the index stores it: its options and a handle `T` to reach it.
pub type Member<T> = (ClientId, SubEntry, T);

#[derive(Debug)]
pub struct SharedGroup<T> {
    /// `<group>/<filter>`: names the group among every node's groups (see [`shared_key`]).
    pub key: Box<str>,
    pub members: Vec<Member<T>>,
    cursor: AtomicUsize,
}

/// The name of shared group `group` of `filter` across nodes.
pub fn shared_key(group: &str, filter: &str) -> String {
    format!("{group}/{filter}")
}

impl<T> SharedGroup<T> {
    fn new(group: &str, filter: &str) -> Self {
        SharedGroup {
            key: shared_key(group, filter).into(),
            members: Vec::new(),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Rotates the group's cursor and returns the members starting from it.
    pub fn rotation(&self) -> impl Iterator<Item = &Member<T>> {
        let n = self.members.len().max(1);
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        self.members
            .iter()
            .cycle()
            .skip(start)
            .take(self.members.len())
    }
}

#[derive(Debug)]
struct Node<T> {
    children: HashMap<Box<str>, Node<T>>,
    direct: HashMap<ClientId, (SubEntry, T)>,
    shared: HashMap<Box<str>, SharedGroup<T>>,
    /// Whether `children` holds `+` / `#`, so matching skips looking them up where they are
    /// not (most levels of most trees).
    has_plus: bool,
    has_hash: bool,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node {
            children: HashMap::default(),
            direct: HashMap::default(),
            shared: HashMap::default(),
            has_plus: false,
            has_hash: false,
        }
    }
}

impl<T> Node<T> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.direct.is_empty() && self.shared.is_empty()
    }
}

/// What a topic matched: plain subscribers and shared groups (one member of each receives).
/// Most publishes match a handful of subscriptions: those fit without an allocation.
pub struct Matches<'a, T> {
    pub direct: SmallVec<[(&'a ClientId, &'a (SubEntry, T)); 4]>,
    pub shared: SmallVec<[&'a SharedGroup<T>; 2]>,
}

impl<T> Default for Matches<'_, T> {
    fn default() -> Self {
        Matches {
            direct: SmallVec::new(),
            shared: SmallVec::new(),
        }
    }
}

/// Most topics [`SubTree::route`] remembers; when full it starts over.
const ROUTES_KEPT: usize = 1024;
/// Longest topic [`SubTree::route`] remembers (response topics are about
/// 100 bytes), so the memory it holds stays small whatever clients publish.
const ROUTE_TOPIC_MAX: usize = 256;

/// The plain subscribers a topic reaches, as [`SubTree::route`] found them.
pub type Route<T> = Arc<[Member<T>]>;

#[derive(Debug)]
pub struct SubTree<T> {
    root: Node<T>,
    count: usize,
    /// Topics routed since the tree last changed, and whom they reached.
    /// Emptied by every [`SubTree::insert`] and [`SubTree::remove`] (the
    /// only ways the tree changes), so an entry is never stale.
    routes: parking_lot::Mutex<HashMap<Box<str>, Route<T>>>,
}

impl<T> Default for SubTree<T> {
    fn default() -> Self {
        SubTree {
            root: Node::default(),
            count: 0,
            routes: parking_lot::Mutex::new(HashMap::default()),
        }
    }
}

impl<T> SubTree<T> {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds or replaces a subscription. Returns true when it already existed.
    pub fn insert(
        &mut self,
        filter: &str,
        group: Option<&str>,
        client: &ClientId,
        e: SubEntry,
        handle: T,
    ) -> bool {
        self.routes.get_mut().clear();
        let mut node = &mut self.root;
        for level in filter.split('/') {
            match level {
                "+" => node.has_plus = true,
                "#" => node.has_hash = true,
                _ => {}
            }
            node = node.children.entry(level.into()).or_default();
        }
        let existed = match group {
            None => node.direct.insert(client.clone(), (e, handle)).is_some(),
            Some(g) => {
                let grp = node
                    .shared
                    .entry(g.into())
                    .or_insert_with(|| SharedGroup::new(g, filter));
                if let Some(slot) = grp.members.iter_mut().find(|(c, _, _)| c == client) {
                    slot.1 = e;
                    slot.2 = handle;
                    true
                } else {
                    grp.members.push((client.clone(), e, handle));
                    false
                }
            }
        };
        if !existed {
            self.count += 1;
        }
        existed
    }

    /// Removes a subscription. Returns true when it existed.
    pub fn remove(&mut self, filter: &str, group: Option<&str>, client: &str) -> bool {
        self.routes.get_mut().clear();
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = Self::remove_at(&mut self.root, &levels, group, client);
        if removed {
            self.count -= 1;
        }
        removed
    }

    fn remove_at(node: &mut Node<T>, levels: &[&str], group: Option<&str>, client: &str) -> bool {
        let Some((first, rest)) = levels.split_first() else {
            return match group {
                None => node.direct.remove(client).is_some(),
                Some(g) => {
                    let Some(grp) = node.shared.get_mut(g) else {
                        return false;
                    };
                    let before = grp.members.len();
                    grp.members.retain(|(c, _, _)| &**c != client);
                    let removed = grp.members.len() != before;
                    if grp.members.is_empty() {
                        node.shared.remove(g);
                    }
                    removed
                }
            };
        };
        let Some(child) = node.children.get_mut(*first) else {
            return false;
        };
        let removed = Self::remove_at(child, rest, group, client);
        if child.is_empty() {
            node.children.remove(*first);
            match *first {
                "+" => node.has_plus = false,
                "#" => node.has_hash = false,
                _ => {}
            }
        }
        removed
    }

    /// Collects every subscription matching `topic`.
    pub fn matches<'a>(&'a self, topic: &str, out: &mut Matches<'a, T>) {
        // Wildcards at the first level do not match topics starting with `$`.
        let wild_first = !topic.starts_with('$');
        Self::walk(&self.root, Some(topic), wild_first, out);
    }

    /// The plain subscribers `topic` reaches, remembered from the last
    /// time it was routed while the tree stayed the same (a service
    /// answering on one response topic after another walks the trie once
    /// per client, not once per answer). `None` when shared groups match
    /// too: their round-robin has to be walked each time, and `out` then
    /// holds every match, as [`SubTree::matches`] gives them.
    pub fn route<'a>(&'a self, topic: &str, out: &mut Matches<'a, T>) -> Option<Route<T>>
    where
        T: Clone,
    {
        if let Some(route) = self.routes.lock().get(topic) {
            return Some(route.clone());
        }
        self.matches(topic, out);
        if !out.shared.is_empty() {
            return None;
        }
        let route: Route<T> = out
            .direct
            .drain(..)
            .map(|(client, (e, handle))| (client.clone(), *e, handle.clone()))
            .collect();
        if topic.len() <= ROUTE_TOPIC_MAX {
            let mut routes = self.routes.lock();
            if routes.len() >= ROUTES_KEPT {
                routes.clear();
            }
            routes.insert(topic.into(), route.clone());
        }
        Some(route)
    }

    /// Matches the levels left in `rest` (`None` once every level is used) below `node`.
    fn walk<'a>(node: &'a Node<T>, rest: Option<&str>, wild_ok: bool, out: &mut Matches<'a, T>) {
        if wild_ok && node.has_hash {
            if let Some(hash) = node.children.get("#") {
                Self::collect(hash, out);
            }
        }
        let Some(rest) = rest else {
            Self::collect(node, out);
            return;
        };
        let (level, tail) = match rest.split_once('/') {
            Some((level, tail)) => (level, Some(tail)),
            None => (rest, None),
        };
        if let Some(child) = node.children.get(level) {
            Self::walk(child, tail, true, out);
        }
        if wild_ok && node.has_plus {
            if let Some(child) = node.children.get("+") {
                Self::walk(child, tail, true, out);
            }
        }
    }

    fn collect<'a>(node: &'a Node<T>, out: &mut Matches<'a, T>) {
        out.direct.extend(node.direct.iter());
        out.shared.extend(node.shared.values());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic;

    fn entry() -> SubEntry {
        SubEntry {
            options: SubscriptionOptions::default(),
            identifier: None,
            filtered: false,
        }
    }

    fn matched(t: &SubTree<()>, topic: &str) -> Vec<String> {
        let mut m = Matches::default();
        t.matches(topic, &mut m);
        let mut v: Vec<String> = m.direct.iter().map(|(c, _)| c.to_string()).collect();
        v.sort();
        v
    }

    /// Whom `route` reaches, as client ids, and whether it was a
    /// remembered route (`None`: shared groups, walked every time).
    fn routed(t: &SubTree<()>, topic: &str) -> Option<Vec<String>> {
        let mut m = Matches::default();
        let route = t.route(topic, &mut m)?;
        let mut v: Vec<String> = route.iter().map(|(c, _, _)| c.to_string()).collect();
        v.sort();
        Some(v)
    }

    #[test]
    fn remembered_routes_follow_every_change() {
        let mut t = SubTree::<()>::default();
        let a: ClientId = "a".into();
        let b: ClientId = "b".into();
        t.insert("x/+", None, &a, entry(), ());
        assert_eq!(routed(&t, "x/y"), Some(vec!["a".to_string()]));
        assert_eq!(routed(&t, "x/y"), Some(vec!["a".to_string()]));
        t.insert("x/y", None, &b, entry(), ());
        assert_eq!(
            routed(&t, "x/y"),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        // Changed options reach the route too.
        let mut qos1 = entry();
        qos1.options.qos = crate::codec::QoS::AtLeastOnce;
        t.insert("x/y", None, &b, qos1, ());
        {
            let mut m = Matches::default();
            let route = t.route("x/y", &mut m).unwrap();
            let (_, e, _) = route.iter().find(|(c, _, _)| &**c == "b").unwrap();
            assert_eq!(e.options.qos, crate::codec::QoS::AtLeastOnce);
        }
        t.remove("x/+", None, "a");
        assert_eq!(routed(&t, "x/y"), Some(vec!["b".to_string()]));
        t.remove("x/y", None, "b");
        assert_eq!(routed(&t, "x/y"), Some(vec![]));
        // A shared group is walked each time, and `matches` has it.
        t.insert("x/y", Some("g"), &a, entry(), ());
        assert_eq!(routed(&t, "x/y"), None);
        let mut m = Matches::default();
        assert!(t.route("x/y", &mut m).is_none());
        assert_eq!(m.shared.len(), 1);
    }

    #[test]
    fn remembered_routes_are_bounded() {
        let mut t = SubTree::<()>::default();
        t.insert("#", None, &"a".into(), entry(), ());
        for i in 0..ROUTES_KEPT * 3 {
            assert_eq!(routed(&t, &format!("t/{i}")), Some(vec!["a".to_string()]));
            assert!(t.routes.lock().len() <= ROUTES_KEPT);
        }
        // Long topics are routed, not remembered.
        t.routes.lock().clear();
        let long = format!("t/{}", "x".repeat(ROUTE_TOPIC_MAX));
        assert_eq!(routed(&t, &long), Some(vec!["a".to_string()]));
        assert!(t.routes.lock().is_empty());
    }

    #[test]
    fn insert_match_remove() {
        let mut t = SubTree::<()>::default();
        let a: ClientId = "a".into();
        let b: ClientId = "b".into();
        assert!(!t.insert("x/+/z", None, &a, entry(), ()));
        assert!(t.insert("x/+/z", None, &a, entry(), ()));
        t.insert("x/#", None, &b, entry(), ());
        assert_eq!(matched(&t, "x/y/z"), vec!["a", "b"]);
        assert_eq!(matched(&t, "x"), vec!["b"]);
        assert!(t.remove("x/+/z", None, "a"));
        assert!(!t.remove("x/+/z", None, "a"));
        assert_eq!(matched(&t, "x/y/z"), vec!["b"]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn dollar_topics_skip_leading_wildcards() {
        let mut t = SubTree::<()>::default();
        let a: ClientId = "a".into();
        t.insert("#", None, &a, entry(), ());
        t.insert("+/x", None, &a, entry(), ());
        assert!(matched(&t, "$SYS/x").is_empty());
    }

    /// A trie holding every valid filter of `filters`, each for a client named by its index.
    fn trie_of(filters: &[String]) -> SubTree<()> {
        let mut t = SubTree::default();
        for (i, f) in filters.iter().enumerate() {
            if topic::valid_topic_filter(f) {
                t.insert(f, None, &ClientId::from(i.to_string()), entry(), ());
            }
        }
        t
    }

    /// The clients (indexes into `filters`, sorted) whose valid filter matches `topic` by the
    /// reference matcher, among those `kept` says are still subscribed.
    fn expected(filters: &[String], topic: &str, kept: impl Fn(usize) -> bool) -> Vec<String> {
        let mut clients: Vec<String> = filters
            .iter()
            .enumerate()
            .filter(|(i, f)| kept(*i) && topic::valid_topic_filter(f) && topic::matches(f, topic))
            .map(|(i, _)| i.to_string())
            .collect();
        clients.sort();
        clients
    }

    proptest::proptest! {
        #[test]
        fn trie_agrees_with_reference_matcher(
            filters in proptest::collection::vec("(a|b|\\+|\\$s)(/(a|b|\\+|#))?(/(a|b|\\+|#))?", 1..8),
            topic in "(a|b|\\$s)(/(a|b))?(/(a|b))?")
        {
            let t = trie_of(&filters);
            proptest::prop_assert_eq!(matched(&t, &topic), expected(&filters, &topic, |_| true));
        }

        /// Removing subscriptions leaves a trie that matches like one built from the rest.
        #[test]
        fn trie_agrees_with_reference_matcher_after_removals(
            filters in proptest::collection::vec("(a|b|\\+|#)(/(a|b|\\+|#))?(/(a|b|\\+|#))?", 1..10),
            removed in proptest::collection::vec(proptest::bool::ANY, 10),
            topic in "(a|b)(/(a|b))?(/(a|b))?")
        {
            let mut t = trie_of(&filters);
            for (i, f) in filters.iter().enumerate() {
                if removed[i] && topic::valid_topic_filter(f) {
                    proptest::prop_assert!(t.remove(f, None, &i.to_string()), "removing {} of {}", f, i);
                }
            }
            proptest::prop_assert_eq!(matched(&t, &topic), expected(&filters, &topic, |i| !removed[i]));
        }
    }
}
