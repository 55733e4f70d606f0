//! The subset of RESP3 the state store uses: arrays of bulk strings, simple
//! strings, integers and nulls.
//!
//! Invariant: the reader never trusts a declared length. Every count and
//! length is checked against the bytes actually left before anything is
//! allocated or sliced, so a 20-byte payload claiming a billion elements costs
//! nothing and cannot panic.

use std::ops::Range;

use bytes::BufMut;

/// Why a payload does not follow the framing rules. Only used inside the
/// crate; public parsers map it onto their own error types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// The smallest encoding of one bulk string (`$0\r\n\r\n`).
const MIN_BULK_LEN: usize = 6;

/// A forward-only cursor over a payload.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Consumes `expected` if the input continues with it.
    pub(crate) fn eat(&mut self, expected: &[u8]) -> bool {
        if self.buf[self.pos..].starts_with(expected) {
            self.pos += expected.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, expected: &[u8]) -> Result<(), Malformed> {
        if self.eat(expected) {
            Ok(())
        } else {
            Err(Malformed)
        }
    }

    /// The bytes up to the next CRLF, consuming the CRLF.
    fn line(&mut self) -> Result<&'a [u8], Malformed> {
        let rest = &self.buf[self.pos..];
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Malformed)?;
        self.pos += end + 2;
        Ok(&rest[..end])
    }

    /// An unsigned decimal line. No sign, at least one digit, no overflow.
    fn unsigned_line(&mut self) -> Result<u64, Malformed> {
        parse_unsigned(self.line()?).ok_or(Malformed)
    }

    /// A signed decimal line (`:` integers may be negative).
    pub(crate) fn signed_line(&mut self) -> Result<i64, Malformed> {
        let line = self.line()?;
        let (negative, digits) = match line.split_first() {
            Some((b'-', digits)) => (true, digits),
            _ => (false, line),
        };
        let magnitude = parse_unsigned(digits).ok_or(Malformed)?;
        if negative {
            0i64.checked_sub_unsigned(magnitude).ok_or(Malformed)
        } else {
            i64::try_from(magnitude).map_err(|_| Malformed)
        }
    }

    /// `*<n>\r\n` for an array of bulk strings, with `n` capped by what the
    /// remaining bytes could hold. Null arrays (`*-1`) are refused.
    pub(crate) fn array_header(&mut self) -> Result<usize, Malformed> {
        self.array_header_of(MIN_BULK_LEN)
    }

    /// `*<n>\r\n` for an array whose elements each take at least
    /// `min_element_len` bytes.
    pub(crate) fn array_header_of(&mut self, min_element_len: usize) -> Result<usize, Malformed> {
        self.expect(b"*")?;
        let n = self.unsigned_line()?;
        let n = usize::try_from(n).map_err(|_| Malformed)?;
        if n > self.remaining() / min_element_len.max(1) {
            return Err(Malformed);
        }
        Ok(n)
    }

    /// `$<len>\r\n<bytes>\r\n`, returning the range of `<bytes>` in the
    /// buffer. `$-1` (null) is refused; callers that allow it check first.
    pub(crate) fn bulk(&mut self) -> Result<Range<usize>, Malformed> {
        self.expect(b"$")?;
        let len = self.unsigned_line()?;
        let len = usize::try_from(len).map_err(|_| Malformed)?;
        // `len + 2` cannot overflow: `len` is at most the buffer length.
        if len > self.remaining() || self.remaining() - len < 2 {
            return Err(Malformed);
        }
        let start = self.pos;
        self.pos += len;
        self.expect(b"\r\n")?;
        Ok(start..start + len)
    }

    /// An array of `n` bulk strings after its header, as ranges.
    pub(crate) fn bulk_elements(&mut self, n: usize) -> Result<Vec<Range<usize>>, Malformed> {
        // `n` is already bounded by the payload size (see `array_header`).
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            ranges.push(self.bulk()?);
        }
        Ok(ranges)
    }

    /// A whole payload that is exactly one non-empty array of bulk strings.
    pub(crate) fn whole_bulk_array(buf: &'a [u8]) -> Result<Vec<Range<usize>>, Malformed> {
        let mut reader = Reader::new(buf);
        let n = reader.array_header()?;
        if n == 0 {
            return Err(Malformed);
        }
        let ranges = reader.bulk_elements(n)?;
        if !reader.is_empty() {
            return Err(Malformed);
        }
        Ok(ranges)
    }
}

fn parse_unsigned(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// The decimal digits of a `u64`, formatted without `fmt` or allocating.
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn new(mut n: u64) -> Decimal {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { digits, start }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

/// Appends `<mark><n>\r\n` with one copy into `out`: the header of an array or a bulk string.
fn put_length_line<B: BufMut>(out: &mut B, mark: u8, n: usize) {
    match u8::try_from(n) {
        // Keys, short values and argument counts: one or two digits.
        Ok(digit @ 0..=9) => out.put_slice(&[mark, b'0' + digit, b'\r', b'\n']),
        Ok(two @ 10..=99) => out.put_slice(&[mark, b'0' + two / 10, b'0' + two % 10, b'\r', b'\n']),
        _ => {
            out.put_u8(mark);
            out.put_slice(Decimal::new(n as u64).as_bytes());
            out.put_slice(b"\r\n");
        }
    }
}

/// Appends `*<n>\r\n`.
pub(crate) fn put_array_header<B: BufMut>(out: &mut B, n: usize) {
    put_length_line(out, b'*', n);
}

/// Appends `$<len>\r\n<bytes>\r\n`.
pub(crate) fn put_bulk<B: BufMut>(out: &mut B, bytes: &[u8]) {
    put_bulk_header(out, bytes.len());
    out.put_slice(bytes);
    out.put_slice(b"\r\n");
}

/// Appends `$<len>\r\n`, what precedes a bulk string of `len` bytes.
pub(crate) fn put_bulk_header<B: BufMut>(out: &mut B, len: usize) {
    put_length_line(out, b'$', len);
}

/// Upper bound of the encoded size of one bulk string, for reservations.
pub(crate) fn bulk_len(bytes: &[u8]) -> usize {
    bytes.len() + 25
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn ranges_to_vecs(buf: &[u8], ranges: &[Range<usize>]) -> Vec<Vec<u8>> {
        ranges.iter().map(|r| buf[r.clone()].to_vec()).collect()
    }

    #[test]
    fn decimals_match_std_formatting() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(Decimal::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    /// Array and bulk headers are the mark, the decimal length and CRLF, on both sides of
    /// each width the headers are written at.
    #[test]
    fn length_lines_match_std_formatting() {
        for n in (0..=1_100).chain([9_999, 10_000, 65_535, 1 << 20, u32::MAX as usize]) {
            let mut out = BytesMut::new();
            put_array_header(&mut out, n);
            put_bulk_header(&mut out, n);
            assert_eq!(&out[..], format!("*{n}\r\n${n}\r\n").as_bytes());
        }
    }

    #[test]
    fn reads_binary_bulk_strings() {
        let buf = b"*2\r\n$4\r\na\r\n\x00\r\n$0\r\n\r\n";
        let ranges = Reader::whole_bulk_array(buf).unwrap();
        assert_eq!(
            ranges_to_vecs(buf, &ranges),
            vec![b"a\r\n\x00".to_vec(), vec![]]
        );
        let buf = b"*1\r\n$1\r\n\x00\r\n";
        let ranges = Reader::whole_bulk_array(buf).unwrap();
        assert_eq!(ranges_to_vecs(buf, &ranges), vec![vec![0u8]]);
    }

    #[test]
    fn refuses_bad_framing() {
        let bad: &[&[u8]] = &[
            b"",
            b"*",
            b"*\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*1\r\n",
            b"*1\r\n$1\r\na",
            b"*1\r\n$1\r\na\r",
            b"*1\r\n$1\r\nab\r\n",
            b"*1\r\n$2\r\na\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$+1\r\na\r\n",
            b"*1\r\n$ 1\r\na\r\n",
            b"*1\r\n$1 \r\na\r\n",
            b"*1\r\n$99999999999999999999999\r\na\r\n",
            b"*1\r\n$18446744073709551615\r\na\r\n",
            b"*1\r\n+OK\r\n",
            b"*1\r\n:1\r\n",
            b"*1\n$1\na\n",
            b"*1\r\n$1\r\na\r\nX",
            b"*1\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"*2\r\n$1\r\na\r\n",
            b"*4294967297\r\n$1\r\na\r\n",
            b"*18446744073709551616\r\n",
            b"$1\r\na\r\n",
        ];
        for payload in bad {
            assert_eq!(
                Reader::whole_bulk_array(payload),
                Err(Malformed),
                "{:?}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    #[test]
    fn leading_zeros_in_lengths_are_accepted() {
        let buf = b"*01\r\n$003\r\nGET\r\n";
        let ranges = Reader::whole_bulk_array(buf).unwrap();
        assert_eq!(ranges_to_vecs(buf, &ranges), vec![b"GET".to_vec()]);
    }

    #[test]
    fn a_line_ends_at_the_first_crlf_only() {
        // A carriage return without its line feed belongs to the line.
        for (buf, line, rest) in [
            (&b"abc\r\nx"[..], Some(&b"abc"[..]), &b"x"[..]),
            (b"\r\n", Some(b""), b""),
            (b"a\rb\r\n", Some(b"a\rb"), b""),
            (b"\r\r\n\r\n", Some(b"\r"), b"\r\n"),
            (b"ab\r", None, b"ab\r"),
            (b"ab\n\r", None, b"ab\n\r"),
            (b"", None, b""),
        ] {
            let mut r = Reader::new(buf);
            assert_eq!(r.line().ok(), line, "{buf:?}");
            assert_eq!(&buf[r.pos..], rest, "{buf:?}");
        }
    }

    #[test]
    fn signed_lines() {
        let mut r = Reader::new(b"-9223372036854775808\r\n");
        assert_eq!(r.signed_line(), Ok(i64::MIN));
        let mut r = Reader::new(b"9223372036854775807\r\n");
        assert_eq!(r.signed_line(), Ok(i64::MAX));
        let mut r = Reader::new(b"9223372036854775808\r\n");
        assert_eq!(r.signed_line(), Err(Malformed));
        let mut r = Reader::new(b"-\r\n");
        assert_eq!(r.signed_line(), Err(Malformed));
        let mut r = Reader::new(b"--1\r\n");
        assert_eq!(r.signed_line(), Err(Malformed));
    }

    #[test]
    fn writers_produce_resp3() {
        let mut out = BytesMut::new();
        put_array_header(&mut out, 2);
        put_bulk(&mut out, b"ab");
        put_bulk(&mut out, b"");
        assert_eq!(&out[..], b"*2\r\n$2\r\nab\r\n$0\r\n\r\n");
        assert!(bulk_len(b"ab") >= b"$2\r\nab\r\n".len());
    }
}
