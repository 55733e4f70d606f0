//! `mqkv passwd FILE USER`: adds a user to a password file or changes its password (Argon2id),
//! or with `-D` removes it. The file is created if missing and replaced whole, so a server
//! reading it never sees half of it.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use mqkv_broker::passwords::Passwords;

#[derive(Args)]
pub struct PasswdArgs {
    /// The password file (created if missing).
    file: PathBuf,
    /// The user to add, change or delete.
    user: String,
    /// Read the password from the first line of standard input instead of prompting.
    #[arg(long)]
    password_stdin: bool,
    /// Delete the user.
    #[arg(short = 'D', long)]
    delete: bool,
}

pub fn run(args: PasswdArgs) -> Result<()> {
    let mut passwords = match Passwords::load(&args.file) {
        Ok(p) => p,
        Err(mqkv_broker::passwords::PasswordFileError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Passwords::default()
        }
        Err(e) => return Err(e.into()),
    };
    if args.delete {
        if !passwords.remove(&args.user) {
            bail!("{} has no user {}", args.file.display(), args.user);
        }
    } else {
        let password = read_password(args.password_stdin)?;
        if password.is_empty() {
            bail!("empty password");
        }
        passwords
            .set(&args.user, password.as_bytes())
            .map_err(anyhow::Error::msg)?;
    }
    write_whole(&args.file, &passwords.to_text())
}

fn read_password(from_stdin: bool) -> Result<String> {
    if from_stdin || !std::io::stdin().is_terminal() {
        if !from_stdin {
            bail!("standard input is not a terminal: give --password-stdin to read it from there");
        }
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        return Ok(line.trim_end_matches(['\r', '\n']).to_owned());
    }
    let first = rpassword::prompt_password("Password: ")?;
    let again = rpassword::prompt_password("Password again: ")?;
    if first != again {
        bail!("the passwords differ");
    }
    Ok(first)
}

/// Writes `text` to a temporary file beside `path`, readable by its owner only, and renames it
/// over `path`.
fn write_whole(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let tmp = match dir {
        Some(d) => d.join(format!(".mqkv-passwd-{}", std::process::id())),
        None => PathBuf::from(format!(".mqkv-passwd-{}", std::process::id())),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    let written = f
        .write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}
