//! What a node says about itself, and the whole group's status gathered
//! from every member.

use std::time::Duration;

use openraft::{RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};

use crate::types::NodeId;

/// How long a status request waits for each member.
pub(crate) const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// A node's part in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    /// Receives the log but does not vote (yet).
    Learner,
    /// Not a member of any group yet (waiting to be added).
    Joining,
    /// Stopped.
    Shutdown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Joining => "joining",
            Role::Shutdown => "shutdown",
        }
    }
}

/// One node's own view of itself and of the group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    /// The address other nodes reach this one at.
    pub cluster_addr: String,
    /// Where clients reach this node (its MQTT listeners).
    pub client_addrs: Vec<String>,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    /// Index of the last log entry applied here.
    pub applied: Option<u64>,
    /// Index of the last log entry stored here.
    pub last_log: Option<u64>,
    /// The members this node knows of, with their cluster addresses.
    pub members: Vec<(NodeId, String)>,
    pub voters: Vec<NodeId>,
    /// On the leader: the last entry each member is known to hold.
    pub matched: Vec<(NodeId, Option<u64>)>,
}

impl MemberStatus {
    pub(crate) fn from_metrics(
        metrics: &RaftMetrics<NodeId, openraft::BasicNode>,
        cluster_addr: String,
        client_addrs: Vec<String>,
    ) -> MemberStatus {
        let membership = metrics.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let members: Vec<(NodeId, String)> = membership
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect();
        let role = match metrics.state {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Shutdown => Role::Shutdown,
            ServerState::Learner | ServerState::Follower if voters.contains(&metrics.id) => {
                Role::Follower
            }
            ServerState::Learner | ServerState::Follower
                if members.iter().any(|(id, _)| *id == metrics.id) =>
            {
                Role::Learner
            }
            ServerState::Learner | ServerState::Follower => Role::Joining,
        };
        let matched = metrics
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log)| (*id, log.map(|l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        MemberStatus {
            id: metrics.id,
            cluster_addr,
            client_addrs,
            role,
            term: metrics.current_term,
            leader: metrics.current_leader,
            applied: metrics.last_applied.map(|l| l.index),
            last_log: metrics.last_log_index,
            members,
            voters,
            matched,
        }
    }
}

/// One line of the group's status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeReport {
    pub id: NodeId,
    pub cluster_addr: String,
    /// Empty when the node could not be asked.
    pub mqtt: Vec<String>,
    /// `None` when the node could not be asked.
    pub role: Option<Role>,
    pub voter: bool,
    pub term: Option<u64>,
    pub applied: Option<u64>,
    /// Entries this node's applied state is behind the leader's log.
    pub lag: Option<u64>,
    /// Why the node could not be asked.
    pub error: Option<String>,
}

/// The group as seen from the node that was asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterStatus {
    pub leader: Option<NodeId>,
    /// The node that answered.
    pub answered_by: NodeId,
    pub nodes: Vec<NodeReport>,
}

impl ClusterStatus {
    /// Joins the members' own answers (`Err` for one that could not be
    /// asked) into one report, as seen by `me`.
    pub(crate) fn gather(
        me: &MemberStatus,
        answers: Vec<(NodeId, String, Result<MemberStatus, String>)>,
    ) -> ClusterStatus {
        let leader_status = answers
            .iter()
            .filter_map(|(_, _, a)| a.as_ref().ok())
            .find(|s| s.role == Role::Leader);
        let leader = leader_status.map(|s| s.id).or(me.leader);
        let head = leader_status.and_then(|s| s.last_log);
        let nodes = answers
            .into_iter()
            .map(|(id, cluster_addr, answer)| match answer {
                Ok(s) => NodeReport {
                    id,
                    cluster_addr,
                    mqtt: s.client_addrs,
                    role: Some(s.role),
                    voter: me.voters.contains(&id),
                    term: Some(s.term),
                    applied: s.applied,
                    lag: head.map(|h| h.saturating_sub(s.applied.unwrap_or(0))),
                    error: None,
                },
                Err(error) => NodeReport {
                    id,
                    cluster_addr,
                    mqtt: Vec::new(),
                    role: None,
                    voter: me.voters.contains(&id),
                    term: None,
                    applied: None,
                    lag: None,
                    error: Some(error),
                },
            })
            .collect();
        ClusterStatus {
            leader,
            answered_by: me.id,
            nodes,
        }
    }
}
