//! How keys and values are shown: binary data never reaches a terminal
//! unescaped unless asked for with `--raw`.
//!
//! Text mode shows bytes as they are when they are printable UTF-8, and as
//! lower-case hex otherwise. JSON shows them as a string when printable,
//! and as `{"hex": "..."}` otherwise, so every JSON document is valid UTF-8
//! and loses nothing.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use serde_json::{json, Value};

#[derive(Args, Debug, Clone, Copy)]
pub struct OutputArgs {
    /// Print JSON (one document, or one per line for streams).
    #[arg(long, conflicts_with = "raw")]
    pub json: bool,
    /// Show values and keys as hexadecimal.
    #[arg(long, conflicts_with = "raw")]
    pub hex: bool,
    /// Write values exactly as stored (no newline after a single value).
    #[arg(long)]
    pub raw: bool,
}

/// Printable text: valid UTF-8 without control characters, except tab and
/// (where lines may span) line breaks.
fn printable(bytes: &[u8], allow_line_breaks: bool) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    let ok = text
        .chars()
        .all(|c| !c.is_control() || c == '\t' || (allow_line_breaks && (c == '\n' || c == '\r')));
    ok.then_some(text)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl OutputArgs {
    /// Bytes for a line of text; `multi_line` allows line breaks inside
    /// (a lone value), otherwise they force hex (a line in a stream).
    pub fn text(&self, bytes: &[u8], multi_line: bool) -> String {
        match printable(bytes, multi_line) {
            Some(text) if !self.hex => text.to_owned(),
            _ => hex(bytes),
        }
    }

    /// Bytes as a JSON value.
    pub fn json_bytes(&self, bytes: &[u8]) -> Value {
        match printable(bytes, true) {
            Some(text) if !self.hex => Value::String(text.to_owned()),
            _ => json!({ "hex": hex(bytes) }),
        }
    }

    /// Writes one value: raw bytes, or text followed by a newline.
    pub fn write_value(&self, value: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        if self.raw {
            out.write_all(value)?;
        } else {
            writeln!(out, "{}", self.text(value, true))?;
        }
        out.flush()
    }

    /// Writes one line of a stream (`keys`, `watch`): raw bytes are still
    /// followed by a newline there.
    pub fn write_stream_item(&self, prefix: &str, bytes: &[u8]) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(prefix.as_bytes())?;
        if self.raw {
            out.write_all(bytes)?;
        } else {
            out.write_all(self.text(bytes, false).as_bytes())?;
        }
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// Prints a line to standard output and flushes it (streams are often piped).
pub fn line(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Prints a JSON document on one line.
pub fn json_line(value: &Value) -> std::io::Result<()> {
    line(&value.to_string())
}

/// The current time as RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(since.as_secs(), since.subsec_millis())
}

fn rfc3339(secs: u64, millis: u32) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3_600,
        (rem % 3_600) / 60,
        rem % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift to an era-based calendar starting on 0000-03-01, in which leap
    // days fall at the end of each year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(hex: bool) -> OutputArgs {
        OutputArgs {
            json: false,
            hex,
            raw: false,
        }
    }

    #[test]
    fn text_is_shown_as_is_and_binary_as_hex() {
        assert_eq!(out(false).text(b"hello world", false), "hello world");
        assert_eq!(out(false).text("grüße".as_bytes(), false), "grüße");
        assert_eq!(out(false).text(b"\x00\xff", false), "00ff");
        assert_eq!(out(false).text(b"\x1b[31m", true), "1b5b33316d");
        assert_eq!(out(true).text(b"hi", false), "6869");
        // Line breaks are kept for a lone value, not inside a stream line.
        assert_eq!(out(false).text(b"a\nb", true), "a\nb");
        assert_eq!(out(false).text(b"a\nb", false), "610a62");
    }

    #[test]
    fn json_uses_strings_or_hex_objects() {
        assert_eq!(out(false).json_bytes(b"v"), json!("v"));
        assert_eq!(out(false).json_bytes(b"\xff"), json!({"hex": "ff"}));
        assert_eq!(out(true).json_bytes(b"v"), json!({"hex": "76"}));
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_700_000_000, 123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(4_102_444_799, 999), "2099-12-31T23:59:59.999Z");
    }
}
