//! The log's masking: reversible, and the same masked whole or in pieces.

use proptest::prelude::*;

use crate::log_file::mask;

proptest! {
    /// Masking twice at the same offset gives the bytes back, and masking
    /// in two pieces, each at its own offset, is masking the whole: a
    /// payload is masked where it is encoded and unmasked where it is
    /// read, at any alignment.
    #[test]
    fn mask_is_its_own_inverse_and_works_in_pieces(
        data in proptest::collection::vec(any::<u8>(), 0..100),
        offset in 0u64..1 << 40,
        split in any::<prop::sample::Index>(),
    ) {
        let mut whole = data.clone();
        mask(&mut whole, offset);
        let at = split.index(data.len() + 1);
        let mut pieces = data.clone();
        let (head, tail) = pieces.split_at_mut(at);
        mask(head, offset);
        mask(tail, offset + at as u64);
        prop_assert_eq!(&pieces, &whole);
        mask(&mut whole, offset);
        prop_assert_eq!(whole, data);
    }

    /// The mask is the stream the log's format defines, byte by byte,
    /// whatever the length and alignment (the whole words in the middle
    /// are masked by a vectorized loop).
    #[test]
    fn mask_is_the_format_stream(
        data in proptest::collection::vec(any::<u8>(), 0..600),
        offset in 0u64..1 << 40,
    ) {
        let mut masked = data.clone();
        mask(&mut masked, offset);
        let expected: Vec<u8> = (offset..)
            .zip(&data)
            .map(|(at, byte)| byte ^ stream_byte(at))
            .collect();
        prop_assert_eq!(masked, expected);
    }
}

/// The byte the format XORs at offset `at`: byte `at % 8` (little
/// endian) of SplitMix64's output for word `at / 8`.
fn stream_byte(at: u64) -> u8 {
    let mut z = (at / 8).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()[(at % 8) as usize]
}

/// A large payload, as a 64 KiB value makes, at an offset that is not a
/// whole word.
#[test]
fn a_large_payload_is_masked_as_the_format_says() {
    let data: Vec<u8> = (0..65_536 + 13).map(|i| (i * 7) as u8).collect();
    let offset = (1 << 33) + 5;
    let mut masked = data.clone();
    mask(&mut masked, offset);
    for (at, (got, byte)) in (offset..).zip(masked.iter().zip(&data)) {
        assert_eq!(*got, byte ^ stream_byte(at), "offset {at}");
    }
    // The first word's stream, pinned: the format must never change.
    let mut zeros = [0u8; 8];
    mask(&mut zeros, 0);
    assert_eq!(u64::from_le_bytes(zeros), 0xE220_A839_7B1D_CDAF);
}
