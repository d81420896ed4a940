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

/// How much of a refused body is read and thrown away before the answer,
/// so that the client, still sending, reads the 413 rather than a reset
/// (closing a socket with unread bytes makes the kernel send RST).
/// Beyond it the connection is simply closed.
pub const DRAIN_BYTES: usize = 16 << 20;

/// Reads up to `max` more bytes of `body` and drops them.
pub async fn drain(body: Body, max: usize) {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    while seen <= max {
        match stream.next().await {
            Some(Ok(chunk)) => seen += chunk.len(),
            _ => return,
        }
    }
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

/// The most bytes `raw_len` bytes in `encoding` can inflate to, capped at
/// `limit`: DEFLATE (gzip, deflate) expands at most 1032:1; zstd has no
/// useful bound, so it may reach the limit.
pub fn inflated_bound(raw_len: usize, encoding: Option<&str>, limit: usize) -> usize {
    match encoding.map(|e| e.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("identity") => raw_len,
        Some("gzip") | Some("x-gzip") | Some("deflate") => raw_len.saturating_mul(1032).saturating_add(1024).min(limit),
        _ => limit,
    }
}

/// Inflates into a buffer whose capacity never passes `limit`, so a bomb
/// costs at most the limit (amortised doubling would allow twice that).
fn inflate(mut r: impl Read, name: &'static str, limit: usize) -> Result<Bytes, BodyError> {
    let mut out: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(BodyError::Corrupt(name, e.to_string())),
        };
        if out.len() + n > limit {
            return Err(BodyError::TooLarge(limit));
        }
        if out.capacity() - out.len() < n {
            let want = (out.capacity() * 2).max(out.len() + n).min(limit);
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
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
        // The DEFLATE bound holds for the densest input there is.
        assert!(inflated_bound(bomb.len(), Some("gzip"), usize::MAX) >= 64 << 20, "{} bytes", bomb.len());
        assert_eq!(inflated_bound(bomb.len(), Some("gzip"), 1 << 20), 1 << 20);
        assert_eq!(inflated_bound(10, Some("zstd"), 1 << 20), 1 << 20);
        assert_eq!(inflated_bound(10, None, 1 << 20), 10);
        assert_eq!(decode(bomb, Some("gzip"), 1 << 20), Err(BodyError::TooLarge(1 << 20)));
        // Garbage and unknown codings are errors, not panics.
        assert!(matches!(decode(Bytes::from_static(b"not gzip"), Some("gzip"), 100), Err(BodyError::Corrupt(..))));
        assert!(matches!(decode(Bytes::from_static(b"not zstd"), Some("zstd"), 100), Err(BodyError::Corrupt(..))));
        let cut = gzip(&data);
        assert!(matches!(decode(cut.slice(..cut.len() / 2), Some("gzip"), 1 << 20), Err(BodyError::Corrupt(..))));
        assert_eq!(decode(Bytes::new(), Some("br"), 10), Err(BodyError::Encoding("br".into())));
    }
}
