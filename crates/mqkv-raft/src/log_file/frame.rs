//! The bytes of a segment: its header, and frames whose payloads are masked for their place.

use std::io;

use super::{Record, FRAME_LEN, HEADER_LEN, LOG_FORMAT, MAGIC, MAX_PAYLOAD, UNWRITTEN_RUN};
use xxhash_rust::xxh3::xxh3_64;

/// What a frame header says: `[payload length: u32][check of the length: u32][XXH3-64 of the
/// payload: u64]`, little endian.
pub(super) struct FrameHeader {
    /// The payload's length.
    pub(super) len: u32,
    /// The payload's XXH3-64.
    pub(super) hash: u64,
}

/// Reads a frame header; `None` if its length fails its check or is beyond the largest payload.
pub(super) fn parse_header(header: &[u8; FRAME_LEN]) -> Option<FrameHeader> {
    let [l0, l1, l2, l3, c0, c1, c2, c3, h @ ..] = *header;
    let len = u32::from_le_bytes([l0, l1, l2, l3]);
    let check = u32::from_le_bytes([c0, c1, c2, c3]);
    (check == length_check(len) && len <= MAX_PAYLOAD).then(|| FrameHeader {
        len,
        hash: u64::from_le_bytes(h),
    })
}

/// Appends `record`'s frame to `out`. With `masked_at`, the offset in the
/// segment of `out`'s first byte, its payload is masked for that place.
pub(super) fn encode(
    record: &Record,
    out: &mut Vec<u8>,
    masked_at: Option<u64>,
) -> io::Result<usize> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_LEN]);
    *out = postcard::serialize_with_flavor(record, crate::flavor::VecFlavor(std::mem::take(out)))
        .map_err(io::Error::other)?;
    let payload_len = out.len() - start - FRAME_LEN;
    let len = u32::try_from(payload_len)
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::other(format!("a log record of {payload_len} bytes")))?;
    if let Some(base) = masked_at {
        let payload_at = base + (start + FRAME_LEN) as u64;
        mask(&mut out[start + FRAME_LEN..], payload_at);
    }
    let hash = xxh3_64(&out[start + FRAME_LEN..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&length_check(len).to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&hash.to_le_bytes());
    Ok(payload_len)
}

fn length_check(len: u32) -> u32 {
    // Truncating the hash is the point: four bytes are enough to tell a
    // length from noise.
    xxh3_64(&len.to_le_bytes()) as u32
}

/// Masks (or unmasks: the mask is its own inverse) payload bytes found at
/// `offset` in a segment: each byte is XORed with a pseudo-random stream
/// of its offset. Encoded records are full of zeros (small integers, empty
/// fields, values of zeros); masked, a run of [`UNWRITTEN_RUN`] zero bytes
/// is as unlikely as guessing a 64-bit key. So zeros in a row inside the
/// log can only be space a write never reached, and opening tells a write
/// torn by a power loss (its lost blocks read as zeros) from damage to
/// acknowledged data.
pub(crate) fn mask(bytes: &mut [u8], offset: u64) {
    let lead = ((8 - offset % 8) % 8) as usize;
    let (head, rest) = bytes.split_at_mut(lead.min(bytes.len()));
    mask_bytes(head, offset);
    let at = offset + head.len() as u64;
    let (words, tail) = rest.as_chunks_mut::<8>();
    mask_words(words, at / 8);
    mask_bytes(tail, at + 8 * words.len() as u64);
}

/// The mask's stream: SplitMix64's output function of the word's number
/// (its offset divided by 8).
#[inline(always)]
fn mask_key(word: u64) -> u64 {
    let mut z = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Masks bytes one by one, the first at `offset` (the ends that are not
/// whole words).
fn mask_bytes(bytes: &mut [u8], offset: u64) {
    for (at, byte) in (offset..).zip(bytes) {
        *byte ^= mask_key(at / 8).to_le_bytes()[(at % 8) as usize];
    }
}

/// Masks whole words, the first of which is word number `first`. Large
/// values make this a per-byte cost of every write and every replay, so
/// the loop is compiled for the widest vector instructions the CPU has
/// (eight streams at once with AVX-512's 64-bit multiply).
fn mask_words(words: &mut [[u8; 8]], first: u64) {
    #[inline(always)]
    fn each(words: &mut [[u8; 8]], first: u64) {
        for (n, word) in (first..).zip(words.iter_mut()) {
            *word = (u64::from_le_bytes(*word) ^ mask_key(n)).to_le_bytes();
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512dq")]
        fn avx512(words: &mut [[u8; 8]], first: u64) {
            each(words, first);
        }
        #[target_feature(enable = "avx2")]
        fn avx2(words: &mut [[u8; 8]], first: u64) {
            each(words, first);
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            // SAFETY: the CPU has just been found to support AVX-512 F and DQ.
            return unsafe { avx512(words, first) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has just been found to support AVX2.
            return unsafe { avx2(words, first) };
        }
    }
    each(words, first);
}

/// Whether `bytes`, up to their last non-zero byte, hold
/// [`UNWRITTEN_RUN`] zero bytes in a row.
pub(super) fn holds_unwritten_run(bytes: &[u8]) -> bool {
    let end = bytes.iter().rposition(|b| *b != 0).unwrap_or(0);
    bytes[..end]
        .split(|b| *b != 0)
        .any(|zeros| zeros.len() >= UNWRITTEN_RUN)
}

pub(super) fn header() -> [u8; HEADER_LEN as usize] {
    let mut header = [0; HEADER_LEN as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&LOG_FORMAT.to_le_bytes());
    header
}

pub(super) fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}
