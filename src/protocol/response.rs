//! Checked decoding of the responses a node reads from another (a
//! follower's Fetch, a forwarded Produce): a cursor that checks every
//! varint, count and length against the bytes that remain before anything
//! is reserved or sliced. `kafka-protocol`'s decoders reserve whatever a
//! count claims (see `guard`), so nothing from the network reaches them.

use bytes::Bytes;

/// Tag and size varints of an empty tagged field.
pub(crate) const TAGGED_FIELD_MIN_BYTES: usize = 2;

/// Why a response could not be decoded. Offsets count from the start of
/// the decoded body (its correlation id).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{api} v{version} responses are not decoded")]
    UnsupportedVersion { api: &'static str, version: i16 },
    #[error("{what} at offset {at}: needs {needed} bytes, {remaining} remain")]
    Truncated { what: &'static str, at: usize, needed: u64, remaining: usize },
    #[error("{what} at offset {at}: varint longer than 5 bytes or beyond u32")]
    BadVarint { what: &'static str, at: usize },
    #[error("{what} at offset {at}: {count} entries cannot fit in the {remaining} bytes that remain")]
    CountTooLarge { what: &'static str, at: usize, count: u64, remaining: usize },
    #[error("{what} at offset {at}: null where the schema does not allow it")]
    UnexpectedNull { what: &'static str, at: usize },
    #[error("{what} at offset {at}: not UTF-8")]
    NotUtf8 { what: &'static str, at: usize },
    #[error("{what}: tagged field {tag} at offset {at} follows tag {previous}; tags must ascend")]
    TagOrder { what: &'static str, at: usize, tag: u32, previous: u32 },
    #[error("{what}: tagged field {tag} at offset {at} declares {declared} bytes but its value is {used}")]
    TaggedFieldSize { what: &'static str, at: usize, tag: u32, declared: u32, used: usize },
    #[error("{count} bytes follow the end of the response at offset {at}")]
    TrailingBytes { at: usize, count: usize },
}

/// A cursor over `buf[pos..end]`. A tagged field is read by a reader whose
/// `end` is the field's declared end, so its value cannot run past it.
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a Bytes,
    pub(crate) pos: usize,
    pub(crate) end: usize,
}

impl<'a> Reader<'a> {
    /// A cursor over the whole of `buf`.
    pub(crate) fn new(buf: &'a Bytes) -> Reader<'a> {
        Reader { buf, pos: 0, end: buf.len() }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.end - self.pos
    }

    /// Claims the next `n` bytes; returns where they start.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<usize, DecodeError> {
        if n > self.remaining() as u64 {
            return Err(DecodeError::Truncated { what, at: self.pos, needed: n, remaining: self.remaining() });
        }
        let at = self.pos;
        self.pos += n as usize; // fits: n <= remaining
        Ok(at)
    }

    pub(crate) fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let at = self.take(N as u64, what)?;
        let mut out = [0; N];
        out.copy_from_slice(&self.buf[at..at + N]);
        Ok(out)
    }

    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        self.fixed(what).map(i16::from_be_bytes)
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.fixed(what).map(i32::from_be_bytes)
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.fixed(what).map(i64::from_be_bytes)
    }

    /// An unsigned varint of at most 5 bytes and at most `u32::MAX`.
    pub(crate) fn uvarint(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let at = self.pos;
        let mut value = 0u32;
        for shift in [0, 7, 14, 21, 28] {
            let [byte] = self.fixed(what)?;
            // The fifth byte holds bits 28..32: more is past u32, and a
            // continuation bit would make a sixth byte.
            if shift == 28 && byte > 0x0f {
                return Err(DecodeError::BadVarint { what, at });
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        Ok(value)
    }

    /// A compact array's count (`None` for null), admitted only if that
    /// many elements of at least `min_bytes` each fit in what remains.
    pub(crate) fn count(&mut self, what: &'static str, min_bytes: usize) -> Result<Option<usize>, DecodeError> {
        let at = self.pos;
        let Some(n) = self.uvarint(what)?.checked_sub(1) else { return Ok(None) };
        if u64::from(n) > (self.remaining() / min_bytes) as u64 {
            return Err(DecodeError::CountTooLarge { what, at, count: n.into(), remaining: self.remaining() });
        }
        Ok(Some(n as usize)) // fits: n <= remaining
    }

    pub(crate) fn required_count(&mut self, what: &'static str, min_bytes: usize) -> Result<usize, DecodeError> {
        let at = self.pos;
        self.count(what, min_bytes)?.ok_or(DecodeError::UnexpectedNull { what, at })
    }

    /// Compact bytes (`None` for null), sliced from the buffer, not copied.
    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
        let Some(n) = self.uvarint(what)?.checked_sub(1) else { return Ok(None) };
        let at = self.take(n.into(), what)?;
        Ok(Some(self.buf.slice(at..self.pos)))
    }

    /// A compact nullable string, checked to be UTF-8, sliced from the
    /// buffer.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
        let at = self.pos;
        let s = self.bytes(what)?;
        if s.as_ref().is_some_and(|s| std::str::from_utf8(s).is_err()) {
            return Err(DecodeError::NotUtf8 { what, at });
        }
        Ok(s)
    }

    /// A compact string that may not be null.
    pub(crate) fn required_string(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let at = self.pos;
        self.string(what)?.ok_or(DecodeError::UnexpectedNull { what, at })
    }

    /// Refuses bytes after the end of what was decoded.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.remaining() > 0 {
            return Err(DecodeError::TrailingBytes { at: self.pos, count: self.remaining() });
        }
        Ok(())
    }

    /// Walks a tagged-field section. `known(tag, field)` reads a field it
    /// knows from `field`, bounded by the field's declared size, and returns
    /// true; it must then have read exactly that size. A field it returns
    /// false for is skipped by its size.
    pub(crate) fn tagged_fields(&mut self, what: &'static str, mut known: impl FnMut(u32, &mut Reader<'a>) -> Result<bool, DecodeError>) -> Result<(), DecodeError> {
        let at = self.pos;
        let n = self.uvarint(what)?;
        if u64::from(n) > (self.remaining() / TAGGED_FIELD_MIN_BYTES) as u64 {
            return Err(DecodeError::CountTooLarge { what, at, count: n.into(), remaining: self.remaining() });
        }
        let mut previous = None;
        for _ in 0..n {
            let at = self.pos;
            let tag = self.uvarint(what)?;
            if let Some(previous) = previous.filter(|p| tag <= *p) {
                return Err(DecodeError::TagOrder { what, at, tag, previous });
            }
            previous = Some(tag);
            let declared = self.uvarint(what)?;
            let start = self.take(declared.into(), what)?;
            let mut field = Reader { buf: self.buf, pos: start, end: self.pos };
            if known(tag, &mut field)? && field.remaining() > 0 {
                return Err(DecodeError::TaggedFieldSize { what, at, tag, declared, used: field.pos - start });
            }
        }
        Ok(())
    }

}

/// Test helper: `decode` refuses every proper prefix of `whole` and
/// `whole` with a byte after it (TrailingBytes).
#[cfg(test)]
pub(crate) fn assert_refuses_truncations_and_trailing_bytes(whole: &Bytes, decode: impl Fn(&Bytes) -> Result<(), DecodeError>) {
    for cut in 0..whole.len() {
        assert!(decode(&whole.slice(..cut)).is_err(), "cut at {cut} of {}", whole.len());
    }
    let mut longer = whole.to_vec();
    longer.push(0);
    assert!(matches!(decode(&Bytes::from(longer)), Err(DecodeError::TrailingBytes { .. })));
}
