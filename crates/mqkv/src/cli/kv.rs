//! `get`, `set`, `del`, `vdel` and `keys`.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use mqkv_client::{DelOptions, DelOutcome, Hlc, SetOptions, SetOutcome, VDelOutcome};
use serde_json::{json, Value};

use super::conn::ConnectionArgs;
use super::output::{self, OutputArgs};
use super::value::{key_bytes, ValueArgs};
use super::{EXIT_NOT_APPLIED, EXIT_NOT_FOUND, EXIT_OK};

pub(super) fn parse_hlc(text: &str) -> Result<Hlc, String> {
    Hlc::parse(text).map_err(|e| format!("not an HLC like 001700000000000:00000:node ({e})"))
}

fn version_json(version: Option<&Hlc>) -> Value {
    version.map_or(Value::Null, |v| Value::String(v.to_string()))
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// The key; with several keys, all are read at one moment (MGET, an mqkv extension) and
    /// each is printed as `KEY VALUE` on a line of its own.
    #[arg(required = true, num_args = 1..)]
    pub key: Vec<OsString>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn get(args: GetArgs) -> anyhow::Result<i32> {
    if args.key.len() > 1 {
        return mget(args).await;
    }
    let key = key_bytes(&args.key[0]);
    let client = args.conn.connect().await?;
    let found = client.get(key.clone()).await;
    client.disconnect().await;
    let out = &args.output;
    match found? {
        Some(entry) => {
            if out.json {
                output::json_line(&json!({
                    "key": out.json_bytes(&key),
                    "found": true,
                    "value": out.json_bytes(&entry.value),
                    "version": entry.version.to_string(),
                }))?;
            } else {
                out.write_value(&entry.value)?;
            }
            Ok(EXIT_OK)
        }
        None => {
            if out.json {
                output::json_line(&json!({ "key": out.json_bytes(&key), "found": false }))?;
            } else {
                eprintln!("mqkv: {}: not found", out.text(&key, false));
            }
            Ok(EXIT_NOT_FOUND)
        }
    }
}

/// `get K1 K2 ...`: one MGET; exit status 1 when any key is missing.
async fn mget(args: GetArgs) -> anyhow::Result<i32> {
    let keys: Vec<bytes::Bytes> = args.key.iter().map(key_bytes).collect();
    let client = args.conn.connect().await?;
    let found = client.mget(keys.clone()).await;
    client.disconnect().await;
    let out = &args.output;
    let mut missing = false;
    for (key, entry) in keys.iter().zip(found?) {
        match entry {
            Some(entry) if out.json => output::json_line(&json!({
                "key": out.json_bytes(key),
                "found": true,
                "value": out.json_bytes(&entry.value),
                "version": entry.version.to_string(),
            }))?,
            Some(entry) => {
                out.write_stream_item(&format!("{} ", out.text(key, false)), &entry.value)?
            }
            None => {
                missing = true;
                if out.json {
                    output::json_line(&json!({ "key": out.json_bytes(key), "found": false }))?;
                } else {
                    eprintln!("mqkv: {}: not found", out.text(key, false));
                }
            }
        }
    }
    Ok(if missing { EXIT_NOT_FOUND } else { EXIT_OK })
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The key.
    pub key: OsString,
    #[command(flatten)]
    pub value: ValueArgs,
    /// Only set the key if it does not exist.
    #[arg(long, conflicts_with_all = ["nex", "if_version"])]
    pub nx: bool,
    /// Only set the key if it does not exist or already holds this value.
    #[arg(long, conflicts_with = "if_version")]
    pub nex: bool,
    /// Only set the key if its version is still this one (compare-and-set, an mqkv
    /// extension): read it with `get --json`.
    #[arg(long, value_name = "VERSION", value_parser = parse_hlc)]
    pub if_version: Option<Hlc>,
    /// Expire the key this many milliseconds after the SET.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub px: Option<u64>,
    /// Fencing token (an HLC, such as a lock's) that proves the right to write a fenced key.
    #[arg(long, value_name = "HLC", value_parser = parse_hlc)]
    pub fencing_token: Option<Hlc>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn set(args: SetArgs) -> anyhow::Result<i32> {
    let key = key_bytes(&args.key);
    let value = args.value.read()?;
    let mut options = SetOptions::new();
    if args.nx {
        options = options.nx();
    }
    if args.nex {
        options = options.nex();
    }
    if let Some(version) = args.if_version {
        options = options.if_version(version);
    }
    if let Some(ms) = args.px {
        options = options.expires_in(Duration::from_millis(ms));
    }
    if let Some(token) = args.fencing_token {
        options = options.fencing_token(token);
    }
    let client = args.conn.connect().await?;
    let outcome = client.set_with(key.clone(), value, &options).await;
    client.disconnect().await;
    let outcome = outcome?;
    let out = &args.output;
    if out.json {
        output::json_line(&json!({
            "key": out.json_bytes(&key),
            "applied": outcome.is_applied(),
            "version": version_json(outcome.version()),
        }))?;
    }
    match outcome {
        SetOutcome::Applied { version } => {
            if !out.json {
                output::line(&format!("OK {version}"))?;
            }
            Ok(EXIT_OK)
        }
        SetOutcome::NotApplied { current_version } => {
            if !out.json {
                match current_version {
                    Some(v) => output::line(&format!("NOT APPLIED {v}"))?,
                    None => output::line("NOT APPLIED")?,
                }
            }
            Ok(EXIT_NOT_APPLIED)
        }
    }
}

#[derive(Args, Debug)]
pub struct DelArgs {
    /// The key.
    pub key: OsString,
    /// Fencing token (an HLC) that proves the right to delete a fenced key.
    #[arg(long, value_name = "HLC", value_parser = parse_hlc)]
    pub fencing_token: Option<Hlc>,
    /// Only delete the key if its version is still this one (an mqkv extension).
    #[arg(long, value_name = "VERSION", value_parser = parse_hlc)]
    pub if_version: Option<Hlc>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

fn del_options(token: Option<Hlc>) -> DelOptions {
    match token {
        Some(token) => DelOptions::new().fencing_token(token),
        None => DelOptions::new(),
    }
}

pub async fn del(args: DelArgs) -> anyhow::Result<i32> {
    let key = key_bytes(&args.key);
    let client = args.conn.connect().await?;
    let mut options = del_options(args.fencing_token);
    if let Some(version) = args.if_version {
        options = options.if_version(version);
    }
    let outcome = client.del_with(key.clone(), &options).await;
    client.disconnect().await;
    let out = &args.output;
    match outcome? {
        DelOutcome::Deleted { version } => {
            if out.json {
                output::json_line(&json!({
                    "key": out.json_bytes(&key),
                    "deleted": true,
                    "version": version_json(version.as_ref()),
                }))?;
            } else {
                output::line(&deleted_line(version.as_ref()))?;
            }
            Ok(EXIT_OK)
        }
        DelOutcome::NotFound => {
            if out.json {
                output::json_line(&json!({ "key": out.json_bytes(&key), "deleted": false }))?;
            } else {
                output::line("NOT FOUND")?;
            }
            Ok(EXIT_NOT_FOUND)
        }
        DelOutcome::NotApplied { current_version } => {
            if out.json {
                output::json_line(&json!({
                    "key": out.json_bytes(&key),
                    "deleted": false,
                    "version": version_json(current_version.as_ref()),
                }))?;
            } else {
                match current_version {
                    Some(v) => output::line(&format!("NOT APPLIED {v}"))?,
                    None => output::line("NOT APPLIED")?,
                }
            }
            Ok(EXIT_NOT_APPLIED)
        }
    }
}

fn deleted_line(version: Option<&Hlc>) -> String {
    match version {
        Some(v) => format!("DELETED {v}"),
        None => "DELETED".into(),
    }
}

#[derive(Args, Debug)]
pub struct VdelArgs {
    /// The key.
    pub key: OsString,
    #[command(flatten)]
    pub value: ValueArgs,
    /// Fencing token (an HLC) that proves the right to delete a fenced key.
    #[arg(long, value_name = "HLC", value_parser = parse_hlc)]
    pub fencing_token: Option<Hlc>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn vdel(args: VdelArgs) -> anyhow::Result<i32> {
    let key = key_bytes(&args.key);
    let value = args.value.read()?;
    let client = args.conn.connect().await?;
    let outcome = client
        .vdel_with(key.clone(), value, &del_options(args.fencing_token))
        .await;
    client.disconnect().await;
    let out = &args.output;
    let (result, version, text, code) = match outcome? {
        VDelOutcome::Deleted { version } => {
            let text = deleted_line(version.as_ref());
            ("deleted", version, text, EXIT_OK)
        }
        VDelOutcome::NotFound => ("not_found", None, "NOT FOUND".into(), EXIT_NOT_FOUND),
        VDelOutcome::ValueMismatch {
            current_version: version,
        } => (
            "value_mismatch",
            version,
            "NOT APPLIED (the value differs)".into(),
            EXIT_NOT_APPLIED,
        ),
    };
    if out.json {
        output::json_line(&json!({
            "key": out.json_bytes(&key),
            "deleted": code == EXIT_OK,
            "result": result,
            "version": version_json(version.as_ref()),
        }))?;
    } else {
        output::line(&text)?;
    }
    Ok(code)
}

#[derive(Args, Debug)]
pub struct KeysArgs {
    /// Glob pattern: `*` any run, `?` one character, `[a-z]` a class, `[!x]` a negated class.
    #[arg(default_value = "*")]
    pub pattern: OsString,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub conn: ConnectionArgs,
}

pub async fn keys(args: KeysArgs) -> anyhow::Result<i32> {
    let pattern = key_bytes(&args.pattern);
    let out = &args.output;
    let client = args.conn.connect().await?;
    let mut pager = client.scan(pattern.clone());
    let mut count = 0usize;
    let mut collected = Vec::new();
    let result = async {
        while let Some(page) = pager.next_page().await? {
            count += page.len();
            for key in page {
                if out.json {
                    collected.push(out.json_bytes(&key));
                } else {
                    out.write_stream_item("", &key)?;
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    client.disconnect().await;
    result?;
    if out.json {
        output::json_line(&json!({
            "pattern": out.json_bytes(&pattern),
            "keys": collected,
        }))?;
    }
    Ok(if count == 0 { EXIT_NOT_FOUND } else { EXIT_OK })
}
