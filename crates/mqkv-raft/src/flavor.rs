//! A postcard output that appends to a `Vec<u8>` with slice copies.
//!
//! postcard's own `ExtendFlavor` hands every byte string to `Extend` as an
//! iterator of bytes, which a vector takes one byte at a time: a log record's
//! key and value, and a snapshot's values, were copied byte by byte. The
//! bytes produced are the same.

/// Serializes into the vector it owns, after what it held already.
pub(crate) struct VecFlavor(pub(crate) Vec<u8>);

impl postcard::ser_flavors::Flavor for VecFlavor {
    type Output = Vec<u8>;

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::VecFlavor;

    #[derive(serde::Serialize)]
    struct Sample<'a> {
        number: u64,
        bytes: bytes::Bytes,
        text: &'a str,
        list: Vec<Option<u32>>,
    }

    /// The flavor appends exactly what postcard's own vector output holds.
    #[test]
    fn same_bytes_as_postcard_after_what_was_there() {
        let sample = Sample {
            number: 1 << 40,
            bytes: bytes::Bytes::from(vec![7u8; 300]),
            text: "key-0001",
            list: vec![None, Some(3), Some(u32::MAX)],
        };
        let expected = postcard::to_stdvec(&sample).expect("encodes");
        let out =
            postcard::serialize_with_flavor(&sample, VecFlavor(b"head".to_vec())).expect("encodes");
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[4..], &expected[..]);
    }
}
