//! The state store commands of `mqkv`: get, set, del, vdel, watch, keys,
//! lock and leader. Each is thin glue over `mqkv-client`; this module owns
//! what they share: connection flags, exit codes, and how errors end the
//! process (one `mqkv: ...` line on standard error).

mod cluster;
mod conn;
mod kv;
mod leader;
mod lock;
mod output;
mod signal;
mod value;
mod watch;

use clap::Subcommand;

/// The exit code table shown in `--help`.
pub const EXIT_CODES: &str = "\
Exit codes (state store commands):
  0  found / applied (lock: the command's own status)
  1  not found
  2  not applied: a condition failed (NX/NEX, VDEL value, lock wait)
  3  error: connection, server error, or usage";

/// Found, applied, or finished normally.
pub const EXIT_OK: i32 = 0;
/// The key (or any matching key) does not exist.
pub const EXIT_NOT_FOUND: i32 = 1;
/// A condition failed, nothing changed.
pub const EXIT_NOT_APPLIED: i32 = 2;
/// Connection trouble, a server error, or bad usage.
pub const EXIT_ERROR: i32 = 3;

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Print the value of a key.
    #[command(after_help = EXIT_CODES)]
    Get(kv::GetArgs),
    /// Store a value under a key.
    #[command(after_help = EXIT_CODES)]
    Set(kv::SetArgs),
    /// Delete a key.
    #[command(after_help = EXIT_CODES)]
    Del(kv::DelArgs),
    /// Delete a key only if it holds the given value.
    #[command(after_help = EXIT_CODES)]
    Vdel(kv::VdelArgs),
    /// Print every change of the given keys until interrupted.
    #[command(after_help = EXIT_CODES)]
    Watch(watch::WatchArgs),
    /// List the keys matching a glob pattern (default `*`).
    #[command(after_help = EXIT_CODES)]
    Keys(kv::KeysArgs),
    /// Run a command while holding a lock, renewing it until the command ends.
    #[command(after_help = lock::AFTER_HELP)]
    Lock(lock::LockArgs),
    /// Campaign for leadership and report every change of leader until interrupted.
    #[command(after_help = EXIT_CODES)]
    Leader(leader::LeaderArgs),
    /// Inspect or change the cluster the connected node belongs to.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Make the connected server read its TLS, password, token and policy files again (as
    /// SIGHUP does); only from the server's own machine.
    Reload(cluster::ReloadArgs),
}

/// Runs one state store command and returns the process exit code.
pub fn run(command: ClientCommand) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mqkv: cannot start the runtime: {e}");
            return EXIT_ERROR;
        }
    };
    let result = runtime.block_on(async move {
        match command {
            ClientCommand::Get(args) => kv::get(args).await,
            ClientCommand::Set(args) => kv::set(args).await,
            ClientCommand::Del(args) => kv::del(args).await,
            ClientCommand::Vdel(args) => kv::vdel(args).await,
            ClientCommand::Keys(args) => kv::keys(args).await,
            ClientCommand::Watch(args) => watch::run(args).await,
            ClientCommand::Lock(args) => lock::run(args).await,
            ClientCommand::Leader(args) => leader::run(args).await,
            ClientCommand::Cluster(command) => cluster::run(command).await,
            ClientCommand::Reload(args) => cluster::reload(args).await,
        }
    });
    // Background tasks (renewals, the connection) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mqkv: {}", one_line(&format!("{e:#}")));
            EXIT_ERROR
        }
    }
}

/// Ends the process for a command line that does not parse: help and
/// version go to standard output with status 0; anything else is one line
/// on standard error with status 3.
pub fn exit_on_parse_error(error: clap::Error) -> ! {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => error.exit(),
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", error.render());
            std::process::exit(EXIT_ERROR);
        }
        _ => {
            let rendered = error.render().to_string();
            // Keep the message, drop the usage block and the hint clap appends.
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|line| !line.starts_with("Usage:"))
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("mqkv: {message} (see --help)");
            std::process::exit(EXIT_ERROR);
        }
    }
}

/// Errors print on one line whatever they contain.
fn one_line(text: &str) -> String {
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_flattened_to_one_line() {
        assert_eq!(one_line("a\nb\r\n  c"), "a b c");
        assert_eq!(one_line("plain"), "plain");
    }
}
