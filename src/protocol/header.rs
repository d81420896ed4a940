//! Request header parsing, done by hand so that every length is checked
//! against the bytes present before anything is read or allocated.
//!
//! ```text
//! v0: api_key i16, api_version i16, correlation_id i32
//! v1: + client_id nullable string (i16 length)
//! v2: + tagged fields (unsigned varint count, then tag, length, bytes each)
//! ```
//! Every API Canopy speaks uses header v1 or v2 (ControlledShutdown v0 is the
//! only v0 user and is not served).

use kafka_protocol::messages::ApiKey;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("request header truncated")]
    Truncated,
    #[error("unknown api key {0}")]
    UnknownApiKey(i16),
    #[error("client id is not UTF-8")]
    BadClientId,
    #[error("header tagged field count {0} is larger than the bytes present")]
    BadTaggedFields(u64),
}

/// The parts of a request header the broker needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: ApiKey,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
    /// Bytes the header took; the request body starts here.
    pub len: usize,
}

/// Reads only the correlation id, for answering a request whose header or
/// body could not be parsed.
pub fn peek_ids(frame: &[u8]) -> Option<(i16, i16, i32)> {
    if frame.len() < 8 {
        return None;
    }
    Some((
        i16::from_be_bytes([frame[0], frame[1]]),
        i16::from_be_bytes([frame[2], frame[3]]),
        i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
    ))
}

pub fn parse(frame: &[u8]) -> Result<RequestHeader, HeaderError> {
    let (key, api_version, correlation_id) = peek_ids(frame).ok_or(HeaderError::Truncated)?;
    let api_key = ApiKey::try_from(key).map_err(|_| HeaderError::UnknownApiKey(key))?;
    let mut pos = 8;
    let header_version = api_key.request_header_version(api_version);
    let mut client_id = None;
    if header_version >= 1 {
        let len_bytes = frame.get(pos..pos + 2).ok_or(HeaderError::Truncated)?;
        let len = i16::from_be_bytes([len_bytes[0], len_bytes[1]]);
        pos += 2;
        if len >= 0 {
            let end = pos + len as usize;
            let raw = frame.get(pos..end).ok_or(HeaderError::Truncated)?;
            client_id =
                Some(std::str::from_utf8(raw).map_err(|_| HeaderError::BadClientId)?.to_owned());
            pos = end;
        }
    }
    if header_version >= 2 {
        let (count, n) = uvarint(&frame[pos..]).ok_or(HeaderError::Truncated)?;
        pos += n;
        if count > (frame.len() - pos) as u64 {
            return Err(HeaderError::BadTaggedFields(count));
        }
        for _ in 0..count {
            let (_tag, n) = uvarint(&frame[pos..]).ok_or(HeaderError::Truncated)?;
            pos += n;
            let (size, n) = uvarint(&frame[pos..]).ok_or(HeaderError::Truncated)?;
            pos += n;
            let size = usize::try_from(size).map_err(|_| HeaderError::Truncated)?;
            if size > frame.len() - pos {
                return Err(HeaderError::Truncated);
            }
            pos += size;
        }
    }
    Ok(RequestHeader { api_key, api_version, correlation_id, client_id, len: pos })
}

/// Unsigned LEB128 varint as used by flexible Kafka versions.
pub fn uvarint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for (i, b) in buf.iter().take(10).enumerate() {
        value |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::RequestHeader as KpHeader;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    #[test]
    fn parses_what_kafka_protocol_encodes() {
        for (key, version) in [(ApiKey::Metadata, 1i16), (ApiKey::Metadata, 12), (ApiKey::Produce, 9)] {
            let header = KpHeader::default()
                .with_request_api_key(key as i16)
                .with_request_api_version(version)
                .with_correlation_id(77)
                .with_client_id(Some(StrBytes::from_static_str("rdkafka")));
            let mut buf = BytesMut::new();
            header.encode(&mut buf, key.request_header_version(version)).unwrap();
            buf.extend_from_slice(b"body");
            let parsed = parse(&buf).unwrap();
            assert_eq!(parsed.api_key, key);
            assert_eq!(parsed.correlation_id, 77);
            assert_eq!(parsed.client_id.as_deref(), Some("rdkafka"));
            assert_eq!(&buf[parsed.len..], b"body");
        }
    }

    #[test]
    fn rejects_truncation_and_unknown_keys() {
        assert_eq!(parse(&[0, 3, 0]), Err(HeaderError::Truncated));
        assert_eq!(parse(&[0x7f, 0x7f, 0, 0, 0, 0, 0, 1]), Err(HeaderError::UnknownApiKey(0x7f7f)));
        // client id claims 100 bytes, 2 present
        assert_eq!(parse(&[0, 3, 0, 1, 0, 0, 0, 1, 0, 100, b'a', b'b']), Err(HeaderError::Truncated));
        // flexible header with a huge tagged-field count
        let mut v = vec![0, 3, 0, 12, 0, 0, 0, 1, 0xff, 0xff];
        v.extend_from_slice(&[0xff, 0xff, 0xff, 0x0f]);
        assert!(parse(&v).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Ok(h) = parse(&data) {
                proptest::prop_assert!(h.len <= data.len());
            }
        }
    }
}
