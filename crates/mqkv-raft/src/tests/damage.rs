//! Files a store must not open, interrupted writes cut off, and logs of earlier formats.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_format_version_is_refused() {
    for target in Target::ALL {
        let dir = tempfile::tempdir().unwrap();
        create_store(dir.path()).await;
        let path = target.path(dir.path());
        let (other, supported) = match target {
            Target::State => {
                set_format_version(&path, 2);
                (2, crate::FORMAT_VERSION)
            }
            Target::OldestSegment | Target::NewestSegment => {
                let other = crate::LOG_FORMAT + 1;
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[8..16].copy_from_slice(&other.to_le_bytes());
                std::fs::write(&path, bytes).unwrap();
                (other, crate::LOG_FORMAT)
            }
        };
        let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
            .await
            .err()
            .expect("a file of another version must be refused");
        match &error {
            OpenError::UnsupportedFormat {
                path: reported,
                found,
                supported: s,
            } if *s == supported && *found == other => assert_eq!(reported, &path),
            other => panic!("{target:?}: unexpected error {other}"),
        }
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
    }
}

type Damage = fn(&mut Vec<u8>);

/// Ways a file can be damaged. Cutting the end off the newest log segment
/// is not among them for the log: that is what an interrupted write looks
/// like (see `an_interrupted_log_write_is_cut_off`).
fn damages(target: Target) -> Vec<(&'static str, Damage)> {
    let mut damages: Vec<(&'static str, Damage)> = vec![
        ("truncated to nothing", |bytes| bytes.clear()),
        ("header overwritten", |bytes| bytes[..16].fill(0x5a)),
        ("body overwritten", |bytes| {
            let len = bytes.len();
            // From inside the data: past it, in a log segment's space
            // allocated ahead, bytes after zeros are a torn write.
            let data_end = data_of(bytes).len();
            let from = 4096.min(data_end / 3);
            bytes[from..len]
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i * 7 + 13) as u8);
        }),
        ("not a data file at all", |bytes| {
            *bytes = b"this is not a data file\n".repeat(1000);
        }),
    ];
    match target {
        Target::State => damages.extend([
            (
                "truncated to half",
                (|bytes| bytes.truncate(bytes.len() / 2)) as Damage,
            ),
            ("truncated by one page", |bytes| {
                bytes.truncate(bytes.len() - 4096)
            }),
            ("redb header overwritten", |bytes| bytes[..512].fill(0x5a)),
        ]),
        Target::OldestSegment | Target::NewestSegment => damages.push((
            // Every byte of a segment is covered by a check. (A redb file
            // has free pages nobody reads.)
            "one byte flipped in the middle",
            |bytes| {
                // Of the data, not of the space allocated ahead of it.
                let data_end = data_of(bytes).len();
                let middle = data_end / 2;
                bytes[middle] ^= 0x01;
            },
        )),
    }
    match target {
        Target::OldestSegment => damages.extend([
            (
                "truncated to half",
                (|bytes| bytes.truncate(bytes.len() / 2)) as Damage,
            ),
            ("truncated by seven bytes", |bytes| {
                bytes.truncate(bytes.len() - 7)
            }),
        ]),
        Target::State | Target::NewestSegment => {}
    }
    damages
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Every file under `dir`, with its size, sorted.
fn file_names(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            names.extend(file_names(&entry.path()));
        } else {
            names.push((entry.path(), entry.metadata().unwrap().len()));
        }
    }
    names.sort();
    names
}

/// Opens the store in `dir` and checks that it is refused as corrupt, with
/// an error naming one of `named`, and that no file under `dir` was
/// created, removed or resized.
async fn assert_refused_as_corrupt(dir: &Path, named: &[&Path], case: &str) {
    let names = file_names(dir);
    let result =
        StoreNode::open_disk_with(dir, config(), Recorder::default().hook(), small_segments())
            .await;
    let error = match result {
        Ok(node) => {
            node.shutdown().await.unwrap();
            panic!("{case}: opened");
        }
        Err(error) => error,
    };
    assert!(
        matches!(error, OpenError::Corrupt { .. }),
        "{case}: {error}"
    );
    let message = error.to_string();
    assert!(
        named
            .iter()
            .any(|path| message.contains(&path.display().to_string())),
        "{case}: {error}"
    );
    assert_eq!(file_names(dir), names, "{case}: files were changed");
}

/// Writes `entry` to `node` (checking its answer against `direct`), then
/// restarts the store in `dir` and checks that it comes back as `direct`.
async fn write_then_restart(dir: &Path, node: StoreNode, direct: &mut StateMachine, entry: Entry) {
    write_both(&node, direct, entry).await;
    node.shutdown().await.unwrap();
    let (node, _) = open(dir, small_segments()).await;
    assert_eq!(snapshot_of(&node), *direct);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_files_are_refused_and_left_untouched() {
    let original = tempfile::tempdir().unwrap();
    let direct = create_store(original.path()).await;
    assert!(
        segments(original.path()).len() >= 2,
        "the log has one segment"
    );
    for target in Target::ALL {
        for (what, damage) in damages(target) {
            let case = format!("{target:?} {what}");
            let dir = tempfile::tempdir().unwrap();
            copy_dir(original.path(), dir.path());
            let path = target.path(dir.path());
            let mut bytes = std::fs::read(&path).unwrap();
            damage(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();

            let log = log_dir(dir.path());
            assert_refused_as_corrupt(dir.path(), &[&path, &log], &case).await;
            assert!(
                std::fs::read(&path).unwrap() == bytes,
                "{case}: the damaged file was modified"
            );
        }
    }
    // The undamaged original still opens with everything in it.
    let (node, _) = open(original.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

/// The start of a frame whose payload never reached the disk: a valid
/// length (with its check) and payload hash, then only part of the payload.
fn interrupted_frame() -> Vec<u8> {
    let payload = vec![0x42u8; 100];
    let len = payload.len() as u32;
    let mut frame = len.to_le_bytes().to_vec();
    frame.extend_from_slice(&(xxhash_rust::xxh3::xxh3_64(&len.to_le_bytes()) as u32).to_le_bytes());
    frame.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
    frame.extend_from_slice(&payload[..37]);
    frame
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

fn append_to(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_log_write_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = create_store(dir.path()).await;
    let newest = Target::NewestSegment.path(dir.path());
    let intact = {
        let (segments, _) = crate::log_file::open(dir.path(), 64 << 20)
            .unwrap()
            .unwrap();
        segments.written_len()
    };
    // Into the space allocated ahead, where the next append would go.
    write_at(&newest, intact, &interrupted_frame());

    let (node, recorder) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    assert!(recorder.seen().is_empty());
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), intact);
    // Writing goes on after the cut, and survives a restart.
    write_then_restart(dir.path(), node, &mut direct, set(T0 + 100, "after", "cut")).await;
}

/// The data of a log segment: its bytes up to the last non-zero one.
fn data_of(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1)]
}

/// A power loss during a write can keep any of its blocks and lose the
/// others (they read as the zeros allocated ahead). Whatever survived of the
/// write is cut off at its first damaged frame, and the acknowledged log
/// before it is kept whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_torn_by_a_power_loss_is_cut_off() {
    const SECTOR: usize = 512;
    let original = tempfile::tempdir().unwrap();
    let (node, _) = open(original.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    for i in 0..20 {
        write_both(&node, &mut direct, set(T0 + i, &format!("k{i}"), "v")).await;
    }
    node.shutdown().await.unwrap();
    let newest = Target::NewestSegment.path(original.path());
    let intact = data_of(&std::fs::read(&newest).unwrap()).len();

    // What the lost writes would have added: the same store, written on.
    let later = tempfile::tempdir().unwrap();
    copy_dir(original.path(), later.path());
    let (node, _) = open(later.path(), NodeOptions::default()).await;
    let mut states = vec![direct.clone()];
    let mut after = direct.clone();
    for i in 0..6 {
        let value = format!("{i}").repeat(700);
        write_both(
            &node,
            &mut after,
            set(T0 + 100 + i, &format!("late{i}"), &value),
        )
        .await;
        states.push(after.clone());
    }
    node.shutdown().await.unwrap();
    let written = std::fs::read(Target::NewestSegment.path(later.path())).unwrap();
    let appended = &data_of(&written)[intact..];
    let sectors = (intact + appended.len()).div_ceil(SECTOR) - intact / SECTOR;
    assert!(sectors >= 8, "{sectors} sectors written");

    let first = intact / SECTOR;
    let cases: Vec<(&str, Vec<usize>)> = vec![
        ("the first block lost", vec![first]),
        ("a middle block lost", vec![first + sectors / 2]),
        (
            "the first and a late block lost",
            vec![first, first + sectors - 2],
        ),
        (
            "every other block lost",
            (first..first + sectors).step_by(2).collect(),
        ),
        (
            "all but the last block lost",
            (first..first + sectors - 1).collect(),
        ),
    ];
    for (case, lost) in cases {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(original.path(), dir.path());
        let path = Target::NewestSegment.path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[intact..intact + appended.len()].copy_from_slice(appended);
        for sector in &lost {
            let from = (sector * SECTOR).max(intact);
            bytes[from..(sector + 1) * SECTOR].fill(0);
        }
        std::fs::write(&path, &bytes).unwrap();

        let (node, _) = open(dir.path(), NodeOptions::default()).await;
        let state = snapshot_of(&node);
        // Frames wholly before the first lost block are whole: they stay.
        let kept = states
            .iter()
            .position(|s| *s == state)
            .unwrap_or_else(|| panic!("{case}: the state is none of the writes' prefixes"));
        if lost.contains(&first) {
            assert_eq!(kept, 0, "{case}");
        }
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(
            len >= intact && len < intact + appended.len(),
            "{case}: {len} bytes kept"
        );
        let mut direct = state;
        write_then_restart(dir.path(), node, &mut direct, set(T0 + 200, "after", "cut")).await;
    }
}

/// Payloads are masked, so even a value of zeros leaves no run of zeros in
/// the log that could pass for space a torn write never reached; it still
/// reads back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeros_in_values_leave_no_zeros_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    let zeros = "\0".repeat(8192);
    write_both(&node, &mut direct, set(T0, "zeros", &zeros)).await;
    write_both(&node, &mut direct, set(T0 + 1, "", "")).await;
    node.shutdown().await.unwrap();
    let bytes = std::fs::read(Target::NewestSegment.path(dir.path())).unwrap();
    let frames = &data_of(&bytes)[16..];
    let longest = frames
        .split(|b| *b != 0)
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0);
    assert!(longest < 8, "{longest} zero bytes in a row");
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

/// Rewrites a log segment of the current format as the previous one wrote
/// it: payloads not masked.
fn rewrite_unmasked(path: &Path) {
    use xxhash_rust::xxh3::xxh3_64;
    let mut bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes[8..16], crate::LOG_FORMAT.to_le_bytes());
    bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
    let mut at = 16;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let check = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        if len == 0 && check == 0 {
            break;
        }
        let payload = at + 16..at + 16 + len as usize;
        crate::log_file::mask(&mut bytes[payload.clone()], payload.start as u64);
        let hash = xxh3_64(&bytes[payload.clone()]);
        bytes[at + 8..at + 16].copy_from_slice(&hash.to_le_bytes());
        at = payload.end;
    }
    std::fs::write(path, bytes).unwrap();
}

/// A log written by the previous format (payloads not masked) opens, takes
/// new writes and starts its new segments in the current format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_the_previous_format_is_read_and_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = create_store(dir.path()).await;
    let old = segments(dir.path());
    for path in &old {
        rewrite_unmasked(path);
    }
    let newest = old.last().unwrap();
    let before = data_of(&std::fs::read(newest).unwrap()).len();
    let (node, _) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    write_both(&node, &mut direct, set(T0 + 999, "first", "w")).await;
    // Appended to in its own format.
    let bytes = std::fs::read(newest).unwrap();
    assert_eq!(bytes[8..16], 1u64.to_le_bytes());
    assert!(data_of(&bytes).len() > before);
    for i in 0..30 {
        let entry = set(T0 + 1000 + i, &format!("new-{i}"), &"w".repeat(200));
        write_both(&node, &mut direct, entry).await;
    }
    node.shutdown().await.unwrap();
    let (node, _) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
    let formats: Vec<u64> = segments(dir.path())
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).unwrap();
            u64::from_le_bytes(bytes[8..16].try_into().unwrap())
        })
        .collect();
    assert_eq!(formats.last(), Some(&crate::LOG_FORMAT), "{formats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_frame_before_the_end_of_the_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    let oldest = Target::OldestSegment.path(dir.path());
    append_to(&oldest, &interrupted_frame());
    assert_refused_as_corrupt(dir.path(), &[&oldest], "a torn frame in an older segment").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
        .await
        .err()
        .expect("second open must fail");
    let log = log_dir(dir.path());
    match &error {
        OpenError::InUse { path } => assert_eq!(path, &log),
        other => panic!("unexpected error {other}"),
    }
    assert!(error.to_string().contains(&log.display().to_string()));
    // The first store is unaffected, and the directory opens once it is closed.
    node.write(set(T0 + 1, "k", "w")).await.unwrap();
    node.shutdown().await.unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    assert_eq!(
        node.read(|m| m.get(b"k", T0 + 1).map(|(v, _)| v)),
        Some(b("w"))
    );
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    std::fs::remove_dir_all(log_dir(dir.path())).unwrap();
    let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
        .await
        .err()
        .expect("a snapshot without its log must be refused");
    assert!(matches!(error, OpenError::Inconsistent { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_creation_is_started_over() {
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join("raft-log.partial");
    std::fs::create_dir(&partial).unwrap();
    std::fs::write(partial.join("00000000000000000001.seg"), b"half-written").unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    node.shutdown().await.unwrap();
    assert!(!partial.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creation_config_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    node.shutdown().await.unwrap();
    let other = StoreConfig {
        max_keys: Some(0),
        ..StoreConfig::new("elsewhere")
    };
    let node = StoreNode::open_disk(dir.path(), other, Recorder::default().hook())
        .await
        .unwrap();
    assert_eq!(node.read(|m| m.config().clone()), config());
    node.shutdown().await.unwrap();
}

/// Writes the log of the closed store in `dir` as the single redb file
/// earlier versions kept it in (`raft-log.redb`: meta, raft state and entry
/// tables), and removes the log directory.
fn rewrite_log_as_legacy_file(dir: &Path) {
    use redb::TableDefinition;
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("mqkv_meta");
    const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
    const RAFT_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

    let (segments, loaded) = crate::log_file::open(dir, 64 << 20).unwrap().unwrap();
    let db = redb::Database::create(dir.join("raft-log.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format_version", 1u64.to_le_bytes().as_slice())
            .unwrap();
        meta.insert("file_kind", b"raft-log".as_slice()).unwrap();
        meta.insert("node_id", loaded.node_id.to_le_bytes().as_slice())
            .unwrap();
        let mut state = txn.open_table(RAFT_STATE).unwrap();
        let vote = postcard::to_stdvec(&loaded.vote.unwrap()).unwrap();
        state.insert("vote", vote.as_slice()).unwrap();
        if let Some(id) = loaded.committed {
            let id = postcard::to_stdvec(&id).unwrap();
            state.insert("committed", id.as_slice()).unwrap();
        }
        if let Some(id) = loaded.last_purged {
            let id = postcard::to_stdvec(&id).unwrap();
            state.insert("last_purged", id.as_slice()).unwrap();
        }
        let mut log = txn.open_table(LOG).unwrap();
        for (id, location) in &loaded.entries {
            let crate::log_file::Record::Entry(entry) = segments.read(*location).unwrap() else {
                panic!("entry {} is not an entry record", id.index);
            };
            let bytes = postcard::to_stdvec(&entry).unwrap();
            log.insert(id.index, bytes.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
    drop(db);
    drop(segments);
    std::fs::remove_dir_all(log_dir(dir)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_earlier_versions_is_converted() {
    let dir = tempfile::tempdir().unwrap();
    // A snapshot and entries after it, so both the purged id and entries
    // have to come across.
    let mut direct = create_store(dir.path()).await;
    let (node, _) = open(dir.path(), small_segments()).await;
    for i in 0..7 {
        write_both(
            &node,
            &mut direct,
            set(T0 + 200 + i, &format!("late-{i}"), "v"),
        )
        .await;
    }
    node.shutdown().await.unwrap();
    rewrite_log_as_legacy_file(dir.path());
    assert!(!log_dir(dir.path()).exists());

    let (node, recorder) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    assert!(recorder.seen().is_empty());
    assert!(!dir.path().join("raft-log.redb").exists());
    assert!(log_dir(dir.path()).exists());
    write_then_restart(
        dir.path(),
        node,
        &mut direct,
        set(T0 + 300, "after", "conversion"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_of_earlier_versions_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    rewrite_log_as_legacy_file(dir.path());
    let legacy = dir.path().join("raft-log.redb");
    let mut bytes = std::fs::read(&legacy).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&legacy, &bytes).unwrap();
    assert_refused_as_corrupt(dir.path(), &[&legacy], "a damaged old log").await;
}
