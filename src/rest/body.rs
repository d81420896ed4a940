//! Request bodies: read with a limit, then inflated (`Content-Encoding`
//! gzip, deflate, zstd) through a reader that stops at the same limit, so
//! a small compressed body cannot grow into unbounded memory. The limit
//! (`rest_max_body_bytes`) applies to the decompressed bytes.

use std::io::Read;

use axum::body::Body;
use bytes::Bytes;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the request body exceeds {0} bytes (after decompression)")]
    TooLarge(usize),
    #[error("unsupported Content-Encoding {0:?} (identity, gzip, deflate or zstd)")]
    Encoding(String),
    #[error("the {0} body does not decompress: {1}")]
    Corrupt(&'static str, String),
    #[error("reading the request body: {0}")]
    Read(String),
}

/// Reads `body` as sent, at most `limit` bytes.
pub async fn read_raw(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        // axum reports an over-long body as a length-limit error.
        if std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit")) || e.to_string().contains("length limit") {
            BodyError::TooLarge(limit)
        } else {
            BodyError::Read(e.to_string())
        }
    })
}

/// Inflates `raw` per `encoding`, refusing output beyond `limit`.
pub fn decode(raw: Bytes, encoding: Option<&str>, limit: usize) -> Result<Bytes, BodyError> {
    let encoding = encoding.map(|e| e.trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("identity") => Ok(raw),
        Some("gzip") | Some("x-gzip") => inflate(flate2::read::MultiGzDecoder::new(&raw[..]), "gzip", limit),
        Some("deflate") => inflate(flate2::read::ZlibDecoder::new(&raw[..]), "deflate", limit),
        Some("zstd") => {
            let d = zstd::stream::read::Decoder::new(&raw[..]).map_err(|e| BodyError::Corrupt("zstd", e.to_string()))?;
            inflate(d, "zstd", limit)
        }
        Some(other) => Err(BodyError::Encoding(other.to_owned())),
    }
}

fn inflate(r: impl Read, name: &'static str, limit: usize) -> Result<Bytes, BodyError> {
    let mut out = Vec::new();
    // One byte past the limit tells "exactly the limit" from "more".
    r.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| BodyError::Corrupt(name, e.to_string()))?;
    if out.len() > limit {
        return Err(BodyError::TooLarge(limit));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(b: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    #[test]
    fn codecs_round_trip_and_bombs_stop_at_the_limit() {
        let data = b"{\"records\":[]}".repeat(100);
        assert_eq!(decode(gzip(&data), Some("gzip"), 1 << 20).unwrap(), &data[..]);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&data).unwrap();
        assert_eq!(decode(Bytes::from(z.finish().unwrap()), Some("Deflate"), 1 << 20).unwrap(), &data[..]);
        let zs = zstd::encode_all(&data[..], 1).unwrap();
        assert_eq!(decode(Bytes::from(zs), Some("zstd"), 1 << 20).unwrap(), &data[..]);
        assert_eq!(decode(Bytes::from_static(b"x"), None, 1).unwrap(), &b"x"[..]);
        // Exactly the limit passes; one more byte does not.
        assert!(decode(gzip(&data), Some("gzip"), data.len()).is_ok());
        assert_eq!(decode(gzip(&data), Some("gzip"), data.len() - 1), Err(BodyError::TooLarge(data.len() - 1)));
        // 64 MiB of zeros in a few KB: refused after reading 1 MiB + 1.
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 64 << 20]).unwrap();
        let bomb = Bytes::from(e.finish().unwrap());
        assert!(bomb.len() < 100_000, "{}", bomb.len());
        assert_eq!(decode(bomb, Some("gzip"), 1 << 20), Err(BodyError::TooLarge(1 << 20)));
        // Garbage and unknown codings are errors, not panics.
        assert!(matches!(decode(Bytes::from_static(b"not gzip"), Some("gzip"), 100), Err(BodyError::Corrupt(..))));
        assert!(matches!(decode(Bytes::from_static(b"not zstd"), Some("zstd"), 100), Err(BodyError::Corrupt(..))));
        let cut = gzip(&data);
        assert!(matches!(decode(cut.slice(..cut.len() / 2), Some("gzip"), 1 << 20), Err(BodyError::Corrupt(..))));
        assert_eq!(decode(Bytes::new(), Some("br"), 10), Err(BodyError::Encoding("br".into())));
    }
}
