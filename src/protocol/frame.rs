//! Kafka framing: a 4-byte big-endian length, then that many bytes.
//!
//! Like mini-redis's `Frame::check`, "not enough bytes yet" is a normal
//! answer (`Ok(None)`), not an error. The length is checked against the
//! configured `max_request_bytes` before a single byte is reserved for it.

use thiserror::Error;

pub const LENGTH_BYTES: usize = 4;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame length {0} is negative")]
    Negative(i32),
    #[error("frame of {size} bytes is over max_request_bytes = {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("frame of {0} bytes is too short for a request header")]
    TooShort(usize),
}

/// Returns the size of the body of the frame at the start of `buf`, once all
/// of it is buffered. `Ok(None)` means more bytes are needed.
pub fn check(buf: &[u8], max_request_bytes: usize) -> Result<Option<usize>, FrameError> {
    let Some(len) = peek_length(buf, max_request_bytes)? else { return Ok(None) };
    if buf.len() - LENGTH_BYTES >= len {
        Ok(Some(len))
    } else {
        Ok(None)
    }
}

/// Reads and checks the length prefix alone, so the caller can size its
/// read buffer before the body arrives.
pub fn peek_length(buf: &[u8], max_request_bytes: usize) -> Result<Option<usize>, FrameError> {
    match peek_token_length(buf, max_request_bytes)? {
        // api key, api version, correlation id, client id length.
        Some(len) if len < 10 => Err(FrameError::TooShort(len)),
        other => Ok(other),
    }
}

/// The length prefix of a raw SASL token (after a version 0
/// SaslHandshake): no header follows, so any length up to the limit is a
/// frame, even 0.
pub fn peek_token_length(buf: &[u8], max_request_bytes: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < LENGTH_BYTES {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < 0 {
        return Err(FrameError::Negative(len));
    }
    let len = len as usize;
    if len > max_request_bytes {
        return Err(FrameError::TooLarge { size: len, limit: max_request_bytes });
    }
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as i32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn incomplete_is_not_an_error() {
        let f = framed(&[0u8; 20]);
        for cut in 0..f.len() {
            assert_eq!(check(&f[..cut], 100), Ok(None));
        }
        assert_eq!(check(&f, 100), Ok(Some(20)));
    }

    #[test]
    fn limits_are_checked_before_the_body_arrives() {
        assert_eq!(check(&(-1i32).to_be_bytes(), 100), Err(FrameError::Negative(-1)));
        assert_eq!(
            check(&(1000i32).to_be_bytes(), 100),
            Err(FrameError::TooLarge { size: 1000, limit: 100 })
        );
        assert_eq!(check(&(3i32).to_be_bytes(), 100), Err(FrameError::TooShort(3)));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..32), max in 0usize..1000) {
            if let Ok(Some(len)) = check(&data, max) {
                proptest::prop_assert!(len <= max && LENGTH_BYTES + len <= data.len());
            }
        }
    }
}
