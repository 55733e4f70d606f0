//! Reading a log back: every segment replayed in order, its records checked as they come.

use std::collections::BTreeMap;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::files::corrupt;
use crate::types::{LogId, NodeId, Vote};
use crate::OpenError;

use super::frame::{all_zero, holds_unwritten_run, mask, parse_header, FrameHeader};
use super::{
    Loaded, Location, Record, FRAME_LEN, HEADER_LEN, LOG_FORMAT, LOG_FORMAT_UNMASKED, MAGIC,
};

/// Replays one segment given as bytes, as opening a store does, and
/// returns the length of its valid part (what opening keeps of the newest
/// segment). For fuzzing the segment decoder; not part of the API.
#[doc(hidden)]
pub fn replay_segment(bytes: &[u8], newest: bool) -> Result<u64, String> {
    let path = Path::new("segment");
    let mut replay = Replay::default();
    let (valid, _, _) = replay
        .segment(1, bytes, newest, path)
        .map_err(|e| e.to_string())?;
    replay.finish(path).map_err(|e| e.to_string())?;
    Ok(valid)
}

/// Replays records in order, checking them as it goes.
#[derive(Default)]
pub(super) struct Replay {
    node_id: Option<NodeId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, (LogId, Location)>,
}

impl Replay {
    /// Replays one segment; returns the length of its valid part, the
    /// highest entry index in it and whether its payloads are masked.
    pub(super) fn segment(
        &mut self,
        seq: u64,
        bytes: &[u8],
        newest: bool,
        path: &Path,
    ) -> Result<(u64, Option<u64>, bool), OpenError> {
        if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC {
            return Err(corrupt(path, "it is not an mqkv log segment (bad header)"));
        }
        let format = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        let masked = format == LOG_FORMAT;
        if !masked && format != LOG_FORMAT_UNMASKED {
            return Err(OpenError::UnsupportedFormat {
                path: path.to_path_buf(),
                found: format,
                supported: LOG_FORMAT,
            });
        }
        let mut offset = HEADER_LEN as usize;
        let mut last_index = None;
        let mut first = true;
        let mut unmasked = Vec::new();
        while offset < bytes.len() {
            let rest = &bytes[offset..];
            // Space allocated ahead of the writes: the end of the log.
            if !first && all_zero(rest) {
                return Ok((offset as u64, last_index, masked));
            }
            // An interrupted write leaves its frames incomplete, or complete
            // but with bytes that never reached the disk, and nothing after
            // them but unwritten (zero) space. Only the newest segment is
            // written to, so only it can end that way. A power loss can also
            // keep some blocks of the write and lose others, in any order:
            // then what follows the damage holds the lost blocks' zeros,
            // which masked data never does.
            let torn = |what: &str, after: usize| -> Result<(u64, Option<u64>, bool), OpenError> {
                let unwritten = all_zero(rest.get(after..).unwrap_or_default())
                    || (masked && holds_unwritten_run(rest));
                if newest && !first && unwritten {
                    Ok((offset as u64, last_index, masked))
                } else {
                    Err(corrupt(
                        path,
                        format!("{what} at byte {offset}, before the end of the log"),
                    ))
                }
            };
            if rest.len() < FRAME_LEN {
                return torn("an incomplete frame header", rest.len());
            }
            let header = rest[..FRAME_LEN].try_into().ok().and_then(parse_header);
            let Some(FrameHeader { len, hash }) = header else {
                return torn("a damaged frame header", FRAME_LEN);
            };
            let end = FRAME_LEN + len as usize;
            if rest.len() < end {
                return torn("an incomplete frame", rest.len());
            }
            let mut payload = &rest[FRAME_LEN..end];
            if xxh3_64(payload) != hash {
                return torn("a record failing its checksum", end);
            }
            if masked {
                unmasked.clear();
                unmasked.extend_from_slice(payload);
                mask(&mut unmasked, (offset + FRAME_LEN) as u64);
                payload = &unmasked;
            }
            let record: Record = postcard::from_bytes(payload).map_err(|e| {
                corrupt(
                    path,
                    format!("the record at byte {offset} does not decode: {e}"),
                )
            })?;
            let location = Location {
                segment: seq,
                offset: (offset + FRAME_LEN) as u64,
                len,
            };
            if first != matches!(record, Record::Start { .. }) {
                return Err(corrupt(
                    path,
                    "a segment must begin with exactly one start record",
                ));
            }
            first = false;
            if let Some(index) = self.record(record, location, path)? {
                last_index = Some(index);
            }
            offset += end;
        }
        if first {
            return Err(corrupt(path, "the segment has no start record"));
        }
        Ok((bytes.len() as u64, last_index, masked))
    }

    /// Applies one record; returns the index of an entry record.
    pub(super) fn record(
        &mut self,
        record: Record,
        location: Location,
        path: &Path,
    ) -> Result<Option<u64>, OpenError> {
        match record {
            Record::Start {
                node_id,
                vote,
                committed,
                last_purged,
            } => {
                if *self.node_id.get_or_insert(node_id) != node_id {
                    return Err(corrupt(
                        path,
                        format!("it belongs to node {node_id}, not {:?}", self.node_id),
                    ));
                }
                // A start record holds the state as of its segment's
                // creation: never older than what earlier segments wrote.
                if vote.is_some() {
                    self.vote = vote;
                }
                self.committed = self.committed.max(committed);
                self.purge(last_purged);
            }
            Record::Entry(entry) => {
                let id = entry.log_id;
                if self.entries.range(id.index..).next().is_some() {
                    return Err(corrupt(
                        path,
                        format!("entry {} is written twice without a truncation", id.index),
                    ));
                }
                if self.last_purged.is_none_or(|p| id.index > p.index) {
                    self.entries.insert(id.index, (id, location));
                }
                return Ok(Some(id.index));
            }
            Record::Vote(vote) => self.vote = Some(vote),
            Record::Committed(id) => self.committed = Some(id),
            Record::Truncate(since) => drop(self.entries.split_off(&since)),
            Record::Purge(upto) => self.purge(Some(upto)),
        }
        Ok(None)
    }

    pub(super) fn purge(&mut self, upto: Option<LogId>) {
        if upto > self.last_purged {
            self.last_purged = upto;
        }
        if let Some(upto) = self.last_purged {
            self.entries = self.entries.split_off(&(upto.index + 1));
        }
    }

    pub(super) fn finish(self, dir: &Path) -> Result<Loaded, OpenError> {
        let node_id = self
            .node_id
            .ok_or_else(|| corrupt(dir, "no segment names its node"))?;
        let first = self.last_purged.map_or(0, |id| id.index + 1);
        let mut entries = Vec::with_capacity(self.entries.len());
        for (expected, (index, (id, location))) in (first..).zip(self.entries) {
            if index != expected {
                return Err(corrupt(
                    dir,
                    format!("the log has a hole: entry {expected} is missing before {index}"),
                ));
            }
            entries.push((id, location));
        }
        Ok(Loaded {
            node_id,
            vote: self.vote,
            committed: self.committed,
            last_purged: self.last_purged,
            entries,
        })
    }
}
