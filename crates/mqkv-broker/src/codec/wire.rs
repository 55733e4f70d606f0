//! The primitive fields of MQTT packets: variable byte integers, two- and four-byte integers,
//! binary data and UTF-8 strings, read with the checks the specification asks of each.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::DecodeError;

pub(crate) fn read_varint(buf: &mut Bytes) -> Result<u32, DecodeError> {
    let mut value: u32 = 0;
    for i in 0..4 {
        if !buf.has_remaining() {
            return Err(DecodeError::Malformed("variable byte integer truncated"));
        }
        let b = buf.get_u8();
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                // Non-minimal encodings are not forbidden outright, but a trailing zero
                // continuation is never produced by a conforming sender; accept it anyway.
            }
            return Ok(value);
        }
    }
    Err(DecodeError::Malformed(
        "variable byte integer longer than 4 bytes",
    ))
}

pub(crate) fn varint_len(v: usize) -> usize {
    match v {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

pub(crate) fn write_varint(out: &mut BytesMut, mut v: usize) {
    loop {
        let mut b = (v % 128) as u8;
        v /= 128;
        if v > 0 {
            b |= 0x80;
        }
        out.put_u8(b);
        if v == 0 {
            break;
        }
    }
}

pub(crate) fn read_u16(buf: &mut Bytes) -> Result<u16, DecodeError> {
    if buf.remaining() < 2 {
        return Err(DecodeError::Malformed("two byte integer truncated"));
    }
    Ok(buf.get_u16())
}

pub(crate) fn read_u32(buf: &mut Bytes) -> Result<u32, DecodeError> {
    if buf.remaining() < 4 {
        return Err(DecodeError::Malformed("four byte integer truncated"));
    }
    Ok(buf.get_u32())
}

pub(crate) fn read_binary(buf: &mut Bytes) -> Result<Bytes, DecodeError> {
    let len = read_u16(buf)? as usize;
    if buf.remaining() < len {
        return Err(DecodeError::Malformed("binary data truncated"));
    }
    Ok(buf.split_to(len))
}

pub(crate) fn read_string(buf: &mut Bytes) -> Result<String, DecodeError> {
    let len = read_u16(buf)? as usize;
    // Checked and copied in place: splitting off a `Bytes` first would cost a reference count
    // taken and dropped for every string of every packet.
    let raw = buf
        .get(..len)
        .ok_or(DecodeError::Malformed("binary data truncated"))?;
    let s = if ascii_without_nul(raw) {
        // SAFETY: ASCII is UTF-8.
        unsafe { std::str::from_utf8_unchecked(raw) }
    } else {
        let s =
            std::str::from_utf8(raw).map_err(|_| DecodeError::Malformed("invalid UTF-8 string"))?;
        if memchr::memchr(0, raw).is_some() {
            return Err(DecodeError::Malformed("string contains U+0000"));
        }
        s
    };
    let owned = s.to_owned();
    buf.advance(len);
    Ok(owned)
}

/// Whether `raw` is ASCII with no NUL, checked eight bytes at a time: a valid MQTT string, as
/// topics, client ids and the request/response conventions' texts almost always are. The
/// general checks (UTF-8, then a search for U+0000) each go over the bytes again.
fn ascii_without_nul(raw: &[u8]) -> bool {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = raw.chunks_exact(8);
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        let w = u64::from_le_bytes(bytes);
        // A high bit set, or a zero byte (the classic test: exact when no high bit is set).
        if (w | (w.wrapping_sub(LOW) & !w)) & HIGH != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&b| b != 0 && b.is_ascii())
}

pub(crate) fn write_bin(out: &mut BytesMut, v: &[u8]) {
    // Every packet is checked before it is encoded (see `limits`), so this never cuts.
    let len = v.len().min(u16::MAX as usize);
    out.put_u16(len as u16);
    out.put_slice(&v[..len]);
}
