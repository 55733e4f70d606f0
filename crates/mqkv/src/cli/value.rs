//! Where a value comes from: the argument, a file (`--file`), or standard
//! input (`-`). Bytes are taken exactly; nothing is trimmed or decoded.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct ValueArgs {
    /// The value; `-` reads it from standard input.
    #[arg(
        value_name = "VALUE",
        required_unless_present = "file",
        allow_hyphen_values = true
    )]
    pub value: Option<OsString>,
    /// Read the value from this file instead (`-`: standard input).
    #[arg(long, value_name = "PATH", conflicts_with = "value")]
    pub file: Option<PathBuf>,
}

impl ValueArgs {
    pub fn read(&self) -> anyhow::Result<Bytes> {
        if let Some(path) = &self.file {
            if path.as_os_str() == "-" {
                return stdin();
            }
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            return Ok(Bytes::from(bytes));
        }
        match &self.value {
            Some(v) if v == "-" => stdin(),
            Some(v) => Ok(Bytes::from(v.clone().into_encoded_bytes())),
            None => anyhow::bail!("a value is needed: VALUE, - or --file"),
        }
    }
}

/// All of standard input, exactly.
fn stdin() -> anyhow::Result<Bytes> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .context("cannot read standard input")?;
    Ok(Bytes::from(bytes))
}

/// A key argument as bytes (any bytes the platform allows in arguments).
pub fn key_bytes(key: &OsString) -> Bytes {
    Bytes::from(key.clone().into_encoded_bytes())
}
