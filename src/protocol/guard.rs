//! Pre-decode guard for Kafka request bodies.
//!
//! # Why this exists
//!
//! The `kafka-protocol` crate (0.18) decodes requests faithfully but trusts
//! every count it reads: `Array` and `CompactArray` decoding call
//! `Vec::with_capacity(n)` with `n` taken straight from the wire, before a
//! single element has been read. A 20-byte request that claims `0x7fffffff`
//! topics makes the broker reserve gigabytes, or abort. DESIGN.md invariant 6
//! says every wire length and count is checked against the bytes present and
//! a configured limit *before* anything is allocated, so the crate's decoder
//! must never see unchecked bytes.
//!
//! [`check_request_body`] walks a request body (the bytes after the request
//! header) with the same field layout as the crate's generated `decode`
//! functions and checks, without allocating anything, that every array count,
//! string length, bytes length, compact (varint) length and tagged-field
//! length fits in the bytes that remain and within [`GuardLimits`]. An array
//! count must fit even if every element had its smallest possible encoding,
//! so what the decoder later reserves is bounded by the body's size times a
//! small constant, and by the limits. The walker itself allocates nothing and
//! its work is linear in the body's size plus the counts it admits.
//!
//! # Contract
//!
//! If the guard returns `Ok(())` for `(api_key, api_version, body)`, the
//! crate's decoder for that request reads exactly the whole body, and fails
//! for no structural reason: strings are UTF-8, non-nullable fields are not
//! null, no tag appears in a version that forbids it. The guard is stricter
//! than the crate in three ways that no conforming client notices: a varint
//! longer than 5 bytes or beyond `u32` is rejected (the crate silently
//! truncates it), a known tagged field must fill exactly the size it declares
//! (the crate ignores the size), and trailing bytes after the body are
//! reported (`TrailingBytes`; the Kafka listener refuses them, reading only
//! librdkafka's all-topics Metadata quirk in their place: see
//! `kafka::handlers::metadata`). Nested encodings (the consumer protocol's
//! subscription and assignment) are walked by [`check_embedded`] with the
//! same rules.
//!
//! # Shape
//!
//! The layout is data, not code: one `Schema` per generated struct, each a
//! list of fields with a wire type and the versions in which the field is
//! present, transcribed from the crate's `*_request.rs` decoders. Compact
//! encodings and tagged-field sections follow from the API's first flexible
//! version, as in the generated code. One generic walker interprets them.
//! Hand-written walkers per API were rejected: thirty copies of the same
//! length logic drift. Patching or forking the crate was rejected too: the
//! generated code would have to be regenerated on every upgrade, and a
//! size-limited buffer alone does not help because the capacity is reserved
//! before any element is read.
//!
//! When `kafka-protocol` is upgraded, the tests below fail if a version range
//! moved; new fields need a new line in the tables here.

use std::fmt;

/// Limits applied while walking one request body. Every count and length is
/// also checked against the bytes that remain, whatever these say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardLimits {
    /// Largest element count of any one array.
    pub max_array_len: usize,
    /// Largest length in bytes of any one string.
    pub max_string_len: usize,
    /// Largest length of any one bytes field (record batches, group metadata,
    /// SASL tokens).
    pub max_bytes_len: usize,
    /// Largest number of tagged fields in any one tagged-field section.
    pub max_tagged_fields: usize,
    /// Largest number of array elements in the whole request, all arrays
    /// together.
    pub max_elements: usize,
    /// Deepest nesting of structs (the request itself is depth 1).
    pub max_depth: usize,
}

impl GuardLimits {
    /// Defaults sized for a broker of up to a million topics: a request may
    /// name every one of them, but not more.
    pub const DEFAULT: GuardLimits = GuardLimits {
        max_array_len: 1 << 20,
        max_string_len: i16::MAX as usize,
        max_bytes_len: 100 << 20,
        max_tagged_fields: 64,
        max_elements: 1 << 22,
        max_depth: 8,
    };
}

impl Default for GuardLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

const _: () = assert!(GuardLimits::DEFAULT.max_array_len <= GuardLimits::DEFAULT.max_elements);
const _: () = assert!(GuardLimits::DEFAULT.max_depth >= MAX_SCHEMA_DEPTH);

/// Where in the request a problem was found: the generated struct's name and
/// the field's name, as in `kafka-protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRef {
    pub schema: &'static str,
    pub field: &'static str,
}

impl fmt::Display for FieldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.field)
    }
}

/// Why a request body was refused. `offset` is the byte offset in the body
/// where the offending length, count or value starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("api key {api_key} is not guarded")]
    UnsupportedApi { api_key: i16 },
    #[error("api key {api_key} version {api_version} is outside {min}..={max}")]
    UnsupportedVersion {
        api_key: i16,
        api_version: i16,
        min: i16,
        max: i16,
    },
    #[error("{at} at offset {offset}: needs {needed} bytes, {remaining} remain")]
    Truncated {
        at: FieldRef,
        offset: usize,
        needed: u64,
        remaining: u64,
    },
    #[error("{at} at offset {offset}: count {count} exceeds the limit {limit}")]
    CountTooLarge {
        at: FieldRef,
        offset: usize,
        count: u64,
        limit: u64,
    },
    #[error("{at} at offset {offset}: length {len} exceeds the limit {limit}")]
    LengthTooLarge {
        at: FieldRef,
        offset: usize,
        len: u64,
        limit: u64,
    },
    #[error("{at} at offset {offset}: negative length {value}")]
    Negative {
        at: FieldRef,
        offset: usize,
        value: i64,
    },
    #[error("{at} at offset {offset}: null in a field that is not nullable")]
    UnexpectedNull { at: FieldRef, offset: usize },
    #[error("{at} at offset {offset}: varint longer than 5 bytes or beyond u32")]
    BadVarint { at: FieldRef, offset: usize },
    #[error("{at} at offset {offset}: string is not UTF-8")]
    InvalidUtf8 { at: FieldRef, offset: usize },
    #[error("{at} at offset {offset}: tag {tag} is not valid in version {version}")]
    TagNotValid {
        at: FieldRef,
        offset: usize,
        tag: u32,
        version: i16,
    },
    #[error("{at} at offset {offset}: tagged field declares {declared} bytes, holds {actual}")]
    TaggedSizeMismatch {
        at: FieldRef,
        offset: usize,
        declared: u64,
        actual: u64,
    },
    #[error("{schema} nests deeper than {limit}")]
    TooDeep { schema: &'static str, limit: usize },
    #[error("{remaining} bytes left over at offset {offset}")]
    TrailingBytes { offset: usize, remaining: usize },
}

/// Checks the body of request `api_key` at `api_version` before it is
/// decoded. `Ok(())` means the body is exactly one well-formed request whose
/// every count and length fits both the bytes present and `limits`.
pub fn check_request_body(
    api_key: i16,
    api_version: i16,
    body: &[u8],
    limits: &GuardLimits,
) -> Result<(), GuardError> {
    let api = APIS
        .iter()
        .find(|api| api.key == api_key)
        .ok_or(GuardError::UnsupportedApi { api_key })?;
    if api_version < api.min || api_version > api.max {
        return Err(GuardError::UnsupportedVersion {
            api_key,
            api_version,
            min: api.min,
            max: api.max,
        });
    }
    let mut walker = Walker {
        buf: body,
        pos: 0,
        end: body.len(),
        version: api_version,
        flexible: api_version >= api.flexible,
        limits,
        elements_left: limits.max_elements,
    };
    walker.walk_struct(api.schema, 1)?;
    if walker.pos != body.len() {
        return Err(GuardError::TrailingBytes {
            offset: walker.pos,
            remaining: body.len() - walker.pos,
        });
    }
    Ok(())
}

/// The version range the guard knows for `api_key`, or `None` if it does not
/// guard that API. A request outside it must not reach the decoder.
pub fn supported_versions(api_key: i16) -> Option<(i16, i16)> {
    APIS.iter()
        .find(|api| api.key == api_key)
        .map(|api| (api.min, api.max))
}

/// Every guarded API as `(api_key, name, min_version, max_version)`, for
/// checking a dispatcher's version table against the guard's.
pub fn guarded_apis() -> impl Iterator<Item = (i16, &'static str, i16, i16)> {
    APIS.iter().map(|api| (api.key, api.name, api.min, api.max))
}

// ---------------------------------------------------------------------------
// Schema vocabulary

/// Wire type of a field. Strings, bytes and arrays use the classic encoding
/// (i16 / i32 / i32 length, -1 for null) below the API's first flexible
/// version and the compact one (unsigned varint of length + 1, 0 for null)
/// from it on.
#[derive(Debug, Clone, Copy)]
enum Ty {
    /// A fixed-width value: integers, booleans, UUIDs.
    Fixed(usize),
    Str {
        nullable: bool,
    },
    Bytes {
        nullable: bool,
    },
    Array {
        nullable: bool,
        elem: Elem,
    },
    Struct(&'static Schema),
}

/// Element type of an array.
#[derive(Debug, Clone, Copy)]
enum Elem {
    Fixed(usize),
    Str,
    Struct(&'static Schema),
}

impl Elem {
    const fn ty(self) -> Ty {
        match self {
            Elem::Fixed(width) => Ty::Fixed(width),
            Elem::Str => Ty::Str { nullable: false },
            Elem::Struct(schema) => Ty::Struct(schema),
        }
    }
}

#[derive(Debug)]
struct Field {
    name: &'static str,
    ty: Ty,
    min: i16,
    max: i16,
}

#[derive(Debug)]
struct TaggedField {
    tag: u32,
    name: &'static str,
    ty: Ty,
    min: i16,
    max: i16,
}

/// One generated struct: its regular fields in wire order, then (in flexible
/// versions) its known tagged fields.
#[derive(Debug)]
struct Schema {
    name: &'static str,
    fields: &'static [Field],
    tagged: &'static [TaggedField],
}

struct Api {
    key: i16,
    name: &'static str,
    min: i16,
    max: i16,
    /// First flexible version; `NEVER` if the API has none.
    flexible: i16,
    schema: &'static Schema,
}

const MAX: i16 = i16::MAX;
const NEVER: i16 = i16::MAX;
/// Deepest struct nesting in the tables below (OffsetFetch v8+: request →
/// group → topic).
const MAX_SCHEMA_DEPTH: usize = 3;

const I8: Ty = Ty::Fixed(1);
const I16: Ty = Ty::Fixed(2);
const I32: Ty = Ty::Fixed(4);
const I64: Ty = Ty::Fixed(8);
const BOOL: Ty = Ty::Fixed(1);
const UUID: Ty = Ty::Fixed(16);
const STR: Ty = Ty::Str { nullable: false };
const NSTR: Ty = Ty::Str { nullable: true };
const BYTES: Ty = Ty::Bytes { nullable: false };
const NBYTES: Ty = Ty::Bytes { nullable: true };
const I32S: Ty = Ty::Array {
    nullable: false,
    elem: Elem::Fixed(4),
};
const I64S: Ty = Ty::Array {
    nullable: false,
    elem: Elem::Fixed(8),
};
const STRS: Ty = Ty::Array {
    nullable: false,
    elem: Elem::Str,
};
const NSTRS: Ty = Ty::Array {
    nullable: true,
    elem: Elem::Str,
};

const fn structs(schema: &'static Schema) -> Ty {
    Ty::Array {
        nullable: false,
        elem: Elem::Struct(schema),
    }
}
const fn nstructs(schema: &'static Schema) -> Ty {
    Ty::Array {
        nullable: true,
        elem: Elem::Struct(schema),
    }
}
const fn f(name: &'static str, ty: Ty, min: i16, max: i16) -> Field {
    Field { name, ty, min, max }
}
const fn t(tag: u32, name: &'static str, ty: Ty, min: i16, max: i16) -> TaggedField {
    TaggedField {
        tag,
        name,
        ty,
        min,
        max,
    }
}
const fn s(name: &'static str, fields: &'static [Field]) -> Schema {
    Schema {
        name,
        fields,
        tagged: &[],
    }
}
const fn tagged(
    name: &'static str,
    fields: &'static [Field],
    tagged: &'static [TaggedField],
) -> Schema {
    Schema {
        name,
        fields,
        tagged,
    }
}
const fn api(
    key: i16,
    name: &'static str,
    min: i16,
    max: i16,
    flexible: i16,
    schema: &'static Schema,
) -> Api {
    Api {
        key,
        name,
        min,
        max,
        flexible,
        schema,
    }
}

// ---------------------------------------------------------------------------
// The walker

struct Walker<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Reads stop here: the body's end, or the end of the tagged field being
    /// walked.
    end: usize,
    version: i16,
    flexible: bool,
    limits: &'a GuardLimits,
    elements_left: usize,
}

impl Walker<'_> {
    fn remaining(&self) -> u64 {
        // usize is at most 64 bits on every supported target.
        (self.end - self.pos) as u64
    }

    /// Consumes `n` bytes and returns where they start.
    fn take(&mut self, n: u64, at: FieldRef) -> Result<usize, GuardError> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(GuardError::Truncated {
                at,
                offset: self.pos,
                needed: n,
                remaining,
            });
        }
        let start = self.pos;
        // n <= remaining, which came from a usize.
        self.pos += n as usize;
        Ok(start)
    }

    /// A classic length prefix: big-endian i32 if `wide`, else i16.
    fn int(&mut self, wide: bool, at: FieldRef) -> Result<i64, GuardError> {
        let start = self.take(if wide { 4 } else { 2 }, at)?;
        let b = &self.buf[start..self.pos];
        Ok(if wide {
            i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        } else {
            i64::from(i16::from_be_bytes([b[0], b[1]]))
        })
    }

    /// An unsigned varint as the crate reads it, refusing the encodings on
    /// which the crate would silently misread (more than 5 bytes, or bits
    /// beyond u32).
    fn uvarint(&mut self, at: FieldRef) -> Result<u32, GuardError> {
        let offset = self.pos;
        let mut value = 0u32;
        for shift in [0, 7, 14, 21, 28] {
            let byte = self.buf[self.take(1, at)?];
            if shift == 28 && byte > 0x0f {
                return Err(GuardError::BadVarint { at, offset });
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        Ok(value)
    }

    /// A length or count prefix; `None` for null. `wide` selects the i32
    /// prefix of bytes and arrays over the i16 one of strings.
    fn length(
        &mut self,
        at: FieldRef,
        wide: bool,
        nullable: bool,
    ) -> Result<Option<u64>, GuardError> {
        let offset = self.pos;
        let n = if self.flexible {
            i64::from(self.uvarint(at)?) - 1
        } else {
            self.int(wide, at)?
        };
        if n == -1 {
            return if nullable {
                Ok(None)
            } else {
                Err(GuardError::UnexpectedNull { at, offset })
            };
        }
        u64::try_from(n)
            .map(Some)
            .map_err(|_| GuardError::Negative {
                at,
                offset,
                value: n,
            })
    }

    /// Smallest encoding of a value of type `ty` in this version.
    fn min_size(&self, ty: Ty) -> u64 {
        let prefix = |wide: bool| match (self.flexible, wide) {
            (true, _) => 1,
            (false, false) => 2,
            (false, true) => 4,
        };
        match ty {
            Ty::Fixed(width) => width as u64,
            Ty::Str { .. } => prefix(false),
            Ty::Bytes { .. } | Ty::Array { .. } => prefix(true),
            Ty::Struct(schema) => {
                let fields: u64 = schema
                    .fields
                    .iter()
                    .filter(|field| (field.min..=field.max).contains(&self.version))
                    .map(|field| self.min_size(field.ty))
                    .sum();
                fields + u64::from(self.flexible)
            }
        }
    }

    fn walk_struct(&mut self, schema: &'static Schema, depth: usize) -> Result<(), GuardError> {
        if depth > self.limits.max_depth {
            return Err(GuardError::TooDeep {
                schema: schema.name,
                limit: self.limits.max_depth,
            });
        }
        for field in schema.fields {
            if (field.min..=field.max).contains(&self.version) {
                let at = FieldRef {
                    schema: schema.name,
                    field: field.name,
                };
                self.walk(field.ty, at, depth)?;
            }
        }
        if self.flexible {
            self.walk_tagged(schema, depth)?;
        }
        Ok(())
    }

    fn walk(&mut self, ty: Ty, at: FieldRef, depth: usize) -> Result<(), GuardError> {
        match ty {
            Ty::Fixed(width) => {
                self.take(width as u64, at)?;
            }
            Ty::Str { nullable } => {
                let offset = self.pos;
                if let Some(len) = self.length(at, false, nullable)? {
                    self.check_len(len, self.limits.max_string_len, at, offset)?;
                    let start = self.take(len, at)?;
                    if std::str::from_utf8(&self.buf[start..self.pos]).is_err() {
                        return Err(GuardError::InvalidUtf8 { at, offset: start });
                    }
                }
            }
            Ty::Bytes { nullable } => {
                let offset = self.pos;
                if let Some(len) = self.length(at, true, nullable)? {
                    self.check_len(len, self.limits.max_bytes_len, at, offset)?;
                    self.take(len, at)?;
                }
            }
            Ty::Array { nullable, elem } => {
                let offset = self.pos;
                let Some(count) = self.length(at, true, nullable)? else {
                    return Ok(());
                };
                let limit = self.limits.max_array_len.min(self.elements_left) as u64;
                if count > limit {
                    return Err(GuardError::CountTooLarge {
                        at,
                        offset,
                        count,
                        limit,
                    });
                }
                let elem = elem.ty();
                let needed = count.saturating_mul(self.min_size(elem));
                let remaining = self.remaining();
                if needed > remaining {
                    return Err(GuardError::Truncated {
                        at,
                        offset,
                        needed,
                        remaining,
                    });
                }
                // count <= elements_left, a usize.
                self.elements_left -= count as usize;
                match elem {
                    Ty::Fixed(_) => {
                        self.take(needed, at)?;
                    }
                    _ => {
                        for _ in 0..count {
                            self.walk(elem, at, depth)?;
                        }
                    }
                }
            }
            Ty::Struct(schema) => self.walk_struct(schema, depth + 1)?,
        }
        Ok(())
    }

    fn check_len(
        &self,
        len: u64,
        limit: usize,
        at: FieldRef,
        offset: usize,
    ) -> Result<(), GuardError> {
        let limit = limit as u64;
        if len > limit {
            return Err(GuardError::LengthTooLarge {
                at,
                offset,
                len,
                limit,
            });
        }
        Ok(())
    }

    /// A tagged-field section: a count, then per field a tag, a size and that
    /// many bytes. Unknown tags are skipped; known ones are walked within
    /// their size, which they must fill exactly.
    fn walk_tagged(&mut self, schema: &'static Schema, depth: usize) -> Result<(), GuardError> {
        let at = FieldRef {
            schema: schema.name,
            field: "tagged_fields",
        };
        let offset = self.pos;
        let count = u64::from(self.uvarint(at)?);
        let limit = self.limits.max_tagged_fields as u64;
        if count > limit {
            return Err(GuardError::CountTooLarge {
                at,
                offset,
                count,
                limit,
            });
        }
        // Each tagged field takes at least a tag byte and a size byte.
        let (needed, remaining) = (count * 2, self.remaining());
        if needed > remaining {
            return Err(GuardError::Truncated {
                at,
                offset,
                needed,
                remaining,
            });
        }
        for _ in 0..count {
            let offset = self.pos;
            let tag = self.uvarint(at)?;
            let size = u64::from(self.uvarint(at)?);
            let start = self.take(size, at)?;
            let Some(known) = schema.tagged.iter().find(|known| known.tag == tag) else {
                continue;
            };
            let at = FieldRef {
                schema: schema.name,
                field: known.name,
            };
            if !(known.min..=known.max).contains(&self.version) {
                return Err(GuardError::TagNotValid {
                    at,
                    offset,
                    tag,
                    version: self.version,
                });
            }
            let (outer_end, field_end) = (self.end, self.pos);
            (self.pos, self.end) = (start, field_end);
            let walked = self.walk(known.ty, at, depth);
            let actual = (self.pos - start) as u64;
            (self.pos, self.end) = (field_end, outer_end);
            walked?;
            if actual != size {
                return Err(GuardError::TaggedSizeMismatch {
                    at,
                    offset,
                    declared: size,
                    actual,
                });
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The request layouts, transcribed from kafka-protocol 0.18's generated
// `decode` functions (src/messages/*_request.rs). One module per API; each
// line is `f(field, wire type, first version, last version)`, `MAX` meaning
// "to the newest", and `t(tag, ...)` for a known tagged field. Fields that
// the crate declares but never decodes in its supported versions are left
// out: OffsetCommitRequestTopic.topic_id, OffsetFetchRequestTopics.topic_id,
// InitProducerIdRequest.enable_2_pc and .keep_prepared_txn.
mod api_versions {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "ApiVersionsRequest",
        &[
            f("client_software_name", STR, 3, MAX),
            f("client_software_version", STR, 3, MAX),
        ],
    );
}

mod metadata {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "MetadataRequest",
        &[
            f("topics", nstructs(&METADATA_REQUEST_TOPIC), 0, MAX),
            f("allow_auto_topic_creation", BOOL, 4, MAX),
            f("include_cluster_authorized_operations", BOOL, 8, 10),
            f("include_topic_authorized_operations", BOOL, 8, MAX),
        ],
    );
    static METADATA_REQUEST_TOPIC: Schema = s(
        "MetadataRequestTopic",
        &[f("topic_id", UUID, 10, MAX), f("name", NSTR, 0, MAX)],
    );
}

mod produce {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "ProduceRequest",
        &[
            f("transactional_id", NSTR, 3, MAX),
            f("acks", I16, 3, MAX),
            f("timeout_ms", I32, 3, MAX),
            f("topic_data", structs(&TOPIC_PRODUCE_DATA), 3, MAX),
        ],
    );
    static TOPIC_PRODUCE_DATA: Schema = s(
        "TopicProduceData",
        &[
            f("name", STR, 3, 12),
            f("topic_id", UUID, 13, MAX),
            f("partition_data", structs(&PARTITION_PRODUCE_DATA), 3, MAX),
        ],
    );
    static PARTITION_PRODUCE_DATA: Schema = s(
        "PartitionProduceData",
        &[f("index", I32, 3, MAX), f("records", NBYTES, 3, MAX)],
    );
}

mod fetch {
    use super::*;
    pub(super) static REQUEST: Schema = tagged(
        "FetchRequest",
        &[
            f("replica_id", I32, 4, 14),
            f("max_wait_ms", I32, 4, MAX),
            f("min_bytes", I32, 4, MAX),
            f("max_bytes", I32, 4, MAX),
            f("isolation_level", I8, 4, MAX),
            f("session_id", I32, 7, MAX),
            f("session_epoch", I32, 7, MAX),
            f("topics", structs(&FETCH_TOPIC), 4, MAX),
            f("forgotten_topics_data", structs(&FORGOTTEN_TOPIC), 7, MAX),
            f("rack_id", STR, 11, MAX),
        ],
        &[
            t(0, "cluster_id", NSTR, 12, MAX),
            t(1, "replica_state", Ty::Struct(&REPLICA_STATE), 15, MAX),
        ],
    );
    static FETCH_TOPIC: Schema = s(
        "FetchTopic",
        &[
            f("topic", STR, 4, 12),
            f("topic_id", UUID, 13, MAX),
            f("partitions", structs(&FETCH_PARTITION), 4, MAX),
        ],
    );
    static FETCH_PARTITION: Schema = tagged(
        "FetchPartition",
        &[
            f("partition", I32, 4, MAX),
            f("current_leader_epoch", I32, 9, MAX),
            f("fetch_offset", I64, 4, MAX),
            f("last_fetched_epoch", I32, 12, MAX),
            f("log_start_offset", I64, 5, MAX),
            f("partition_max_bytes", I32, 4, MAX),
        ],
        &[
            t(0, "replica_directory_id", UUID, 17, MAX),
            t(1, "high_watermark", I64, 18, MAX),
        ],
    );
    static FORGOTTEN_TOPIC: Schema = s(
        "ForgottenTopic",
        &[
            f("topic", STR, 7, 12),
            f("topic_id", UUID, 13, MAX),
            f("partitions", I32S, 7, MAX),
        ],
    );
    static REPLICA_STATE: Schema = s(
        "ReplicaState",
        &[
            f("replica_id", I32, 15, MAX),
            f("replica_epoch", I64, 15, MAX),
        ],
    );
}

mod list_offsets {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "ListOffsetsRequest",
        &[
            f("replica_id", I32, 1, MAX),
            f("isolation_level", I8, 2, MAX),
            f("topics", structs(&LIST_OFFSETS_TOPIC), 1, MAX),
            f("timeout_ms", I32, 10, MAX),
        ],
    );
    static LIST_OFFSETS_TOPIC: Schema = s(
        "ListOffsetsTopic",
        &[
            f("name", STR, 1, MAX),
            f("partitions", structs(&LIST_OFFSETS_PARTITION), 1, MAX),
        ],
    );
    static LIST_OFFSETS_PARTITION: Schema = s(
        "ListOffsetsPartition",
        &[
            f("partition_index", I32, 1, MAX),
            f("current_leader_epoch", I32, 4, MAX),
            f("timestamp", I64, 1, MAX),
        ],
    );
}

mod offset_for_leader_epoch {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "OffsetForLeaderEpochRequest",
        &[
            f("replica_id", I32, 3, MAX),
            f("topics", structs(&OFFSET_FOR_LEADER_TOPIC), 2, MAX),
        ],
    );
    static OFFSET_FOR_LEADER_TOPIC: Schema = s(
        "OffsetForLeaderTopic",
        &[
            f("topic", STR, 2, MAX),
            f("partitions", structs(&OFFSET_FOR_LEADER_PARTITION), 2, MAX),
        ],
    );
    static OFFSET_FOR_LEADER_PARTITION: Schema = s(
        "OffsetForLeaderPartition",
        &[
            f("partition", I32, 2, MAX),
            f("current_leader_epoch", I32, 2, MAX),
            f("leader_epoch", I32, 2, MAX),
        ],
    );
}

mod create_topics {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "CreateTopicsRequest",
        &[
            f("topics", structs(&CREATABLE_TOPIC), 2, MAX),
            f("timeout_ms", I32, 2, MAX),
            f("validate_only", BOOL, 2, MAX),
        ],
    );
    static CREATABLE_TOPIC: Schema = s(
        "CreatableTopic",
        &[
            f("name", STR, 2, MAX),
            f("num_partitions", I32, 2, MAX),
            f("replication_factor", I16, 2, MAX),
            f(
                "assignments",
                structs(&CREATABLE_REPLICA_ASSIGNMENT),
                2,
                MAX,
            ),
            f("configs", structs(&CREATABLE_TOPIC_CONFIG), 2, MAX),
        ],
    );
    static CREATABLE_REPLICA_ASSIGNMENT: Schema = s(
        "CreatableReplicaAssignment",
        &[
            f("partition_index", I32, 2, MAX),
            f("broker_ids", I32S, 2, MAX),
        ],
    );
    static CREATABLE_TOPIC_CONFIG: Schema = s(
        "CreatableTopicConfig",
        &[f("name", STR, 2, MAX), f("value", NSTR, 2, MAX)],
    );
}

mod delete_topics {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DeleteTopicsRequest",
        &[
            f("topics", structs(&DELETE_TOPIC_STATE), 6, MAX),
            f("topic_names", STRS, 1, 5),
            f("timeout_ms", I32, 1, MAX),
        ],
    );
    static DELETE_TOPIC_STATE: Schema = s(
        "DeleteTopicState",
        &[f("name", NSTR, 6, MAX), f("topic_id", UUID, 6, MAX)],
    );
}

mod create_partitions {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "CreatePartitionsRequest",
        &[
            f("topics", structs(&CREATE_PARTITIONS_TOPIC), 0, MAX),
            f("timeout_ms", I32, 0, MAX),
            f("validate_only", BOOL, 0, MAX),
        ],
    );
    static CREATE_PARTITIONS_TOPIC: Schema = s(
        "CreatePartitionsTopic",
        &[
            f("name", STR, 0, MAX),
            f("count", I32, 0, MAX),
            f(
                "assignments",
                nstructs(&CREATE_PARTITIONS_ASSIGNMENT),
                0,
                MAX,
            ),
        ],
    );
    static CREATE_PARTITIONS_ASSIGNMENT: Schema = s(
        "CreatePartitionsAssignment",
        &[f("broker_ids", I32S, 0, MAX)],
    );
}

mod describe_configs {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DescribeConfigsRequest",
        &[
            f("resources", structs(&DESCRIBE_CONFIGS_RESOURCE), 1, MAX),
            f("include_synonyms", BOOL, 1, MAX),
            f("include_documentation", BOOL, 3, MAX),
        ],
    );
    static DESCRIBE_CONFIGS_RESOURCE: Schema = s(
        "DescribeConfigsResource",
        &[
            f("resource_type", I8, 1, MAX),
            f("resource_name", STR, 1, MAX),
            f("configuration_keys", NSTRS, 1, MAX),
        ],
    );
}

mod alter_configs {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "AlterConfigsRequest",
        &[
            f("resources", structs(&ALTER_CONFIGS_RESOURCE), 0, MAX),
            f("validate_only", BOOL, 0, MAX),
        ],
    );
    static ALTER_CONFIGS_RESOURCE: Schema = s(
        "AlterConfigsResource",
        &[
            f("resource_type", I8, 0, MAX),
            f("resource_name", STR, 0, MAX),
            f("configs", structs(&ALTERABLE_CONFIG), 0, MAX),
        ],
    );
    static ALTERABLE_CONFIG: Schema = s(
        "AlterableConfig",
        &[f("name", STR, 0, MAX), f("value", NSTR, 0, MAX)],
    );
}

mod incremental_alter_configs {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "IncrementalAlterConfigsRequest",
        &[
            f("resources", structs(&ALTER_CONFIGS_RESOURCE), 0, MAX),
            f("validate_only", BOOL, 0, MAX),
        ],
    );
    static ALTER_CONFIGS_RESOURCE: Schema = s(
        "AlterConfigsResource",
        &[
            f("resource_type", I8, 0, MAX),
            f("resource_name", STR, 0, MAX),
            f("configs", structs(&ALTERABLE_CONFIG), 0, MAX),
        ],
    );
    static ALTERABLE_CONFIG: Schema = s(
        "AlterableConfig",
        &[
            f("name", STR, 0, MAX),
            f("config_operation", I8, 0, MAX),
            f("value", NSTR, 0, MAX),
        ],
    );
}

mod describe_cluster {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DescribeClusterRequest",
        &[
            f("include_cluster_authorized_operations", BOOL, 0, MAX),
            f("endpoint_type", I8, 1, MAX),
            f("include_fenced_brokers", BOOL, 2, MAX),
        ],
    );
}

mod find_coordinator {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "FindCoordinatorRequest",
        &[
            f("key", STR, 0, 3),
            f("key_type", I8, 1, MAX),
            f("coordinator_keys", STRS, 4, MAX),
        ],
    );
}

mod join_group {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "JoinGroupRequest",
        &[
            f("group_id", STR, 0, MAX),
            f("session_timeout_ms", I32, 0, MAX),
            f("rebalance_timeout_ms", I32, 1, MAX),
            f("member_id", STR, 0, MAX),
            f("group_instance_id", NSTR, 5, MAX),
            f("protocol_type", STR, 0, MAX),
            f("protocols", structs(&JOIN_GROUP_REQUEST_PROTOCOL), 0, MAX),
            f("reason", NSTR, 8, MAX),
        ],
    );
    static JOIN_GROUP_REQUEST_PROTOCOL: Schema = s(
        "JoinGroupRequestProtocol",
        &[f("name", STR, 0, MAX), f("metadata", BYTES, 0, MAX)],
    );
}

mod sync_group {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "SyncGroupRequest",
        &[
            f("group_id", STR, 0, MAX),
            f("generation_id", I32, 0, MAX),
            f("member_id", STR, 0, MAX),
            f("group_instance_id", NSTR, 3, MAX),
            f("protocol_type", NSTR, 5, MAX),
            f("protocol_name", NSTR, 5, MAX),
            f(
                "assignments",
                structs(&SYNC_GROUP_REQUEST_ASSIGNMENT),
                0,
                MAX,
            ),
        ],
    );
    static SYNC_GROUP_REQUEST_ASSIGNMENT: Schema = s(
        "SyncGroupRequestAssignment",
        &[f("member_id", STR, 0, MAX), f("assignment", BYTES, 0, MAX)],
    );
}

mod heartbeat {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "HeartbeatRequest",
        &[
            f("group_id", STR, 0, MAX),
            f("generation_id", I32, 0, MAX),
            f("member_id", STR, 0, MAX),
            f("group_instance_id", NSTR, 3, MAX),
        ],
    );
}

mod leave_group {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "LeaveGroupRequest",
        &[
            f("group_id", STR, 0, MAX),
            f("member_id", STR, 0, 2),
            f("members", structs(&MEMBER_IDENTITY), 3, MAX),
        ],
    );
    static MEMBER_IDENTITY: Schema = s(
        "MemberIdentity",
        &[
            f("member_id", STR, 3, MAX),
            f("group_instance_id", NSTR, 3, MAX),
            f("reason", NSTR, 5, MAX),
        ],
    );
}

mod offset_commit {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "OffsetCommitRequest",
        &[
            f("group_id", STR, 2, MAX),
            f("generation_id_or_member_epoch", I32, 2, MAX),
            f("member_id", STR, 2, MAX),
            f("group_instance_id", NSTR, 7, MAX),
            f("retention_time_ms", I64, 2, 4),
            f("topics", structs(&OFFSET_COMMIT_REQUEST_TOPIC), 2, MAX),
        ],
    );
    static OFFSET_COMMIT_REQUEST_TOPIC: Schema = s(
        "OffsetCommitRequestTopic",
        &[
            f("name", STR, 2, MAX),
            f(
                "partitions",
                structs(&OFFSET_COMMIT_REQUEST_PARTITION),
                2,
                MAX,
            ),
        ],
    );
    static OFFSET_COMMIT_REQUEST_PARTITION: Schema = s(
        "OffsetCommitRequestPartition",
        &[
            f("partition_index", I32, 2, MAX),
            f("committed_offset", I64, 2, MAX),
            f("committed_leader_epoch", I32, 6, MAX),
            f("committed_metadata", NSTR, 2, MAX),
        ],
    );
}

mod offset_fetch {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "OffsetFetchRequest",
        &[
            f("group_id", STR, 1, 7),
            f("topics", nstructs(&OFFSET_FETCH_REQUEST_TOPIC), 1, 7),
            f("groups", structs(&OFFSET_FETCH_REQUEST_GROUP), 8, MAX),
            f("require_stable", BOOL, 7, MAX),
        ],
    );
    static OFFSET_FETCH_REQUEST_TOPIC: Schema = s(
        "OffsetFetchRequestTopic",
        &[f("name", STR, 1, 7), f("partition_indexes", I32S, 1, 7)],
    );
    static OFFSET_FETCH_REQUEST_GROUP: Schema = s(
        "OffsetFetchRequestGroup",
        &[
            f("group_id", STR, 8, MAX),
            f("member_id", NSTR, 9, MAX),
            f("member_epoch", I32, 9, MAX),
            f("topics", nstructs(&OFFSET_FETCH_REQUEST_TOPICS), 8, MAX),
        ],
    );
    static OFFSET_FETCH_REQUEST_TOPICS: Schema = s(
        "OffsetFetchRequestTopics",
        &[f("name", STR, 8, MAX), f("partition_indexes", I32S, 8, MAX)],
    );
}

mod list_groups {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "ListGroupsRequest",
        &[
            f("states_filter", STRS, 4, MAX),
            f("types_filter", STRS, 5, MAX),
        ],
    );
}

mod describe_groups {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DescribeGroupsRequest",
        &[
            f("groups", STRS, 0, MAX),
            f("include_authorized_operations", BOOL, 3, MAX),
        ],
    );
}

mod delete_groups {
    use super::*;
    pub(super) static REQUEST: Schema =
        s("DeleteGroupsRequest", &[f("groups_names", STRS, 0, MAX)]);
}

mod offset_delete {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "OffsetDeleteRequest",
        &[
            f("group_id", STR, 0, MAX),
            f("topics", structs(&OFFSET_DELETE_REQUEST_TOPIC), 0, MAX),
        ],
    );
    static OFFSET_DELETE_REQUEST_TOPIC: Schema = s(
        "OffsetDeleteRequestTopic",
        &[
            f("name", STR, 0, MAX),
            f(
                "partitions",
                structs(&OFFSET_DELETE_REQUEST_PARTITION),
                0,
                MAX,
            ),
        ],
    );
    static OFFSET_DELETE_REQUEST_PARTITION: Schema = s(
        "OffsetDeleteRequestPartition",
        &[f("partition_index", I32, 0, MAX)],
    );
}

mod init_producer_id {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "InitProducerIdRequest",
        &[
            f("transactional_id", NSTR, 0, MAX),
            f("transaction_timeout_ms", I32, 0, MAX),
            f("producer_id", I64, 3, MAX),
            f("producer_epoch", I16, 3, MAX),
        ],
    );
}

mod add_partitions_to_txn {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "AddPartitionsToTxnRequest",
        &[
            f(
                "transactions",
                structs(&ADD_PARTITIONS_TO_TXN_TRANSACTION),
                4,
                MAX,
            ),
            f("v3_and_below_transactional_id", STR, 0, 3),
            f("v3_and_below_producer_id", I64, 0, 3),
            f("v3_and_below_producer_epoch", I16, 0, 3),
            f(
                "v3_and_below_topics",
                structs(&ADD_PARTITIONS_TO_TXN_TOPIC),
                0,
                3,
            ),
        ],
    );
    static ADD_PARTITIONS_TO_TXN_TRANSACTION: Schema = s(
        "AddPartitionsToTxnTransaction",
        &[
            f("transactional_id", STR, 4, MAX),
            f("producer_id", I64, 4, MAX),
            f("producer_epoch", I16, 4, MAX),
            f("verify_only", BOOL, 4, MAX),
            f("topics", structs(&ADD_PARTITIONS_TO_TXN_TOPIC), 4, MAX),
        ],
    );
    static ADD_PARTITIONS_TO_TXN_TOPIC: Schema = s(
        "AddPartitionsToTxnTopic",
        &[f("name", STR, 0, MAX), f("partitions", I32S, 0, MAX)],
    );
}

mod add_offsets_to_txn {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "AddOffsetsToTxnRequest",
        &[
            f("transactional_id", STR, 0, MAX),
            f("producer_id", I64, 0, MAX),
            f("producer_epoch", I16, 0, MAX),
            f("group_id", STR, 0, MAX),
        ],
    );
}

mod end_txn {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "EndTxnRequest",
        &[
            f("transactional_id", STR, 0, MAX),
            f("producer_id", I64, 0, MAX),
            f("producer_epoch", I16, 0, MAX),
            f("committed", BOOL, 0, MAX),
        ],
    );
}

mod describe_transactions {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DescribeTransactionsRequest",
        &[f("transactional_ids", STRS, 0, MAX)],
    );
}

mod list_transactions {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "ListTransactionsRequest",
        &[
            f("state_filters", STRS, 0, MAX),
            f("producer_id_filters", I64S, 0, MAX),
            f("duration_filter", I64, 1, MAX),
            f("transactional_id_pattern", NSTR, 2, MAX),
        ],
    );
}

mod txn_offset_commit {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "TxnOffsetCommitRequest",
        &[
            f("transactional_id", STR, 0, MAX),
            f("group_id", STR, 0, MAX),
            f("producer_id", I64, 0, MAX),
            f("producer_epoch", I16, 0, MAX),
            f("generation_id", I32, 3, MAX),
            f("member_id", STR, 3, MAX),
            f("group_instance_id", NSTR, 3, MAX),
            f("topics", structs(&TXN_OFFSET_COMMIT_REQUEST_TOPIC), 0, MAX),
        ],
    );
    static TXN_OFFSET_COMMIT_REQUEST_TOPIC: Schema = s(
        "TxnOffsetCommitRequestTopic",
        &[
            f("name", STR, 0, MAX),
            f(
                "partitions",
                structs(&TXN_OFFSET_COMMIT_REQUEST_PARTITION),
                0,
                MAX,
            ),
        ],
    );
    static TXN_OFFSET_COMMIT_REQUEST_PARTITION: Schema = s(
        "TxnOffsetCommitRequestPartition",
        &[
            f("partition_index", I32, 0, MAX),
            f("committed_offset", I64, 0, MAX),
            f("committed_leader_epoch", I32, 2, MAX),
            f("committed_metadata", NSTR, 0, MAX),
        ],
    );
}

mod delete_records {
    use super::*;
    pub(super) static REQUEST: Schema = s(
        "DeleteRecordsRequest",
        &[
            f("topics", structs(&DELETE_RECORDS_TOPIC), 0, MAX),
            f("timeout_ms", I32, 0, MAX),
        ],
    );
    static DELETE_RECORDS_TOPIC: Schema = s(
        "DeleteRecordsTopic",
        &[
            f("name", STR, 0, MAX),
            f("partitions", structs(&DELETE_RECORDS_PARTITION), 0, MAX),
        ],
    );
    static DELETE_RECORDS_PARTITION: Schema = s(
        "DeleteRecordsPartition",
        &[f("partition_index", I32, 0, MAX), f("offset", I64, 0, MAX)],
    );
}

mod sasl_handshake {
    use super::*;
    pub(super) static REQUEST: Schema = s("SaslHandshakeRequest", &[f("mechanism", STR, 0, MAX)]);
}

mod sasl_authenticate {
    use super::*;
    pub(super) static REQUEST: Schema =
        s("SaslAuthenticateRequest", &[f("auth_bytes", BYTES, 0, MAX)]);
}

/// Encodings clients nest inside requests: the consumer protocol's
/// subscription (JoinGroup member metadata) and assignment (SyncGroup),
/// from kafka-protocol 0.18's `consumer_protocol_*.rs`. Never flexible.
mod consumer_protocol {
    use super::*;
    pub(super) static SUBSCRIPTION: Schema = s(
        "ConsumerProtocolSubscription",
        &[
            f("topics", STRS, 0, MAX),
            f("user_data", NBYTES, 0, MAX),
            f("owned_partitions", structs(&TOPIC_PARTITION), 1, MAX),
            f("generation_id", I32, 2, MAX),
            f("rack_id", NSTR, 3, MAX),
        ],
    );
    pub(super) static ASSIGNMENT: Schema = s(
        "ConsumerProtocolAssignment",
        &[
            f("assigned_partitions", structs(&TOPIC_PARTITION), 0, MAX),
            f("user_data", NBYTES, 0, MAX),
        ],
    );
    static TOPIC_PARTITION: Schema = s(
        "TopicPartition",
        &[f("topic", STR, 0, MAX), f("partitions", I32S, 0, MAX)],
    );
}

/// An encoding nested in a request's bytes field, walked with the same
/// rules as a request body before anything decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedded {
    ConsumerSubscription,
    ConsumerAssignment,
}

impl Embedded {
    /// Newest version the schema (and the crate) knows: Kafka reads a
    /// newer blob as this version, ignoring the fields it does not know.
    pub const MAX_VERSION: i16 = 3;

    fn schema(self) -> &'static Schema {
        match self {
            Embedded::ConsumerSubscription => &consumer_protocol::SUBSCRIPTION,
            Embedded::ConsumerAssignment => &consumer_protocol::ASSIGNMENT,
        }
    }
}

/// Checks a nested encoding (without its version prefix) at `version`
/// and returns how many bytes the decoder will read; the bytes after are
/// fields of a newer version, which Kafka ignores as well.
pub fn check_embedded(kind: Embedded, version: i16, body: &[u8], limits: &GuardLimits) -> Result<usize, GuardError> {
    if !(0..=Embedded::MAX_VERSION).contains(&version) {
        return Err(GuardError::UnsupportedVersion { api_key: -1, api_version: version, min: 0, max: Embedded::MAX_VERSION });
    }
    let mut walker = Walker {
        buf: body,
        pos: 0,
        end: body.len(),
        version,
        flexible: false,
        limits,
        elements_left: limits.max_elements,
    };
    walker.walk_struct(kind.schema(), 1)?;
    Ok(walker.pos)
}

static APIS: &[Api] = &[
    api(18, "ApiVersions", 0, 4, 3, &api_versions::REQUEST),
    api(3, "Metadata", 0, 13, 9, &metadata::REQUEST),
    api(0, "Produce", 3, 13, 9, &produce::REQUEST),
    api(1, "Fetch", 4, 18, 12, &fetch::REQUEST),
    api(2, "ListOffsets", 1, 10, 6, &list_offsets::REQUEST),
    api(
        23,
        "OffsetForLeaderEpoch",
        2,
        4,
        4,
        &offset_for_leader_epoch::REQUEST,
    ),
    api(19, "CreateTopics", 2, 7, 5, &create_topics::REQUEST),
    api(20, "DeleteTopics", 1, 6, 4, &delete_topics::REQUEST),
    api(37, "CreatePartitions", 0, 3, 2, &create_partitions::REQUEST),
    api(32, "DescribeConfigs", 1, 4, 4, &describe_configs::REQUEST),
    api(33, "AlterConfigs", 0, 2, 2, &alter_configs::REQUEST),
    api(
        44,
        "IncrementalAlterConfigs",
        0,
        1,
        1,
        &incremental_alter_configs::REQUEST,
    ),
    api(60, "DescribeCluster", 0, 2, 0, &describe_cluster::REQUEST),
    api(10, "FindCoordinator", 0, 6, 3, &find_coordinator::REQUEST),
    api(11, "JoinGroup", 0, 9, 6, &join_group::REQUEST),
    api(14, "SyncGroup", 0, 5, 4, &sync_group::REQUEST),
    api(12, "Heartbeat", 0, 4, 4, &heartbeat::REQUEST),
    api(13, "LeaveGroup", 0, 5, 4, &leave_group::REQUEST),
    api(8, "OffsetCommit", 2, 9, 8, &offset_commit::REQUEST),
    api(9, "OffsetFetch", 1, 9, 6, &offset_fetch::REQUEST),
    api(16, "ListGroups", 0, 5, 3, &list_groups::REQUEST),
    api(15, "DescribeGroups", 0, 6, 5, &describe_groups::REQUEST),
    api(42, "DeleteGroups", 0, 2, 2, &delete_groups::REQUEST),
    api(47, "OffsetDelete", 0, 0, NEVER, &offset_delete::REQUEST),
    api(22, "InitProducerId", 0, 5, 2, &init_producer_id::REQUEST),
    api(
        24,
        "AddPartitionsToTxn",
        0,
        5,
        3,
        &add_partitions_to_txn::REQUEST,
    ),
    api(25, "AddOffsetsToTxn", 0, 4, 3, &add_offsets_to_txn::REQUEST),
    api(26, "EndTxn", 0, 5, 3, &end_txn::REQUEST),
    api(28, "TxnOffsetCommit", 0, 5, 3, &txn_offset_commit::REQUEST),
    api(
        65,
        "DescribeTransactions",
        0,
        0,
        0,
        &describe_transactions::REQUEST,
    ),
    api(66, "ListTransactions", 0, 2, 0, &list_transactions::REQUEST),
    api(21, "DeleteRecords", 0, 2, 2, &delete_records::REQUEST),
    api(17, "SaslHandshake", 0, 1, NEVER, &sasl_handshake::REQUEST),
    api(36, "SaslAuthenticate", 0, 2, 2, &sasl_authenticate::REQUEST),
];

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages as km;
    use kafka_protocol::messages::{BrokerId, GroupId, ProducerId, TopicName, TransactionalId};
    use kafka_protocol::protocol::{
        Decodable, Encodable, Message, Request, StrBytes, VersionRange,
    };
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    // ---- building real requests with kafka-protocol -----------------------

    fn st(s: &'static str) -> StrBytes {
        StrBytes::from_static_str(s)
    }
    fn topic(i: usize) -> TopicName {
        TopicName(st(["app.codestore.commits", "tōpic-ünicode"][i]))
    }
    fn group() -> GroupId {
        GroupId(st("group-1"))
    }
    fn two<T>(make: impl Fn(usize) -> T) -> Vec<T> {
        (0..2).map(make).collect()
    }
    /// An unknown tagged field, which flexible versions must skip.
    fn extra() -> BTreeMap<i32, Bytes> {
        BTreeMap::from([(99, Bytes::from_static(b"xyz"))])
    }
    /// A non-nil UUID without depending on the `uuid` crate: decode one.
    macro_rules! uuid {
        () => {{
            let wire = [[7u8; 16].as_slice(), &[1, 0]].concat();
            km::metadata_request::MetadataRequestTopic::decode(&mut wire.as_slice(), 10)
                .unwrap()
                .topic_id
        }};
    }

    fn api_versions(_v: i16) -> km::ApiVersionsRequest {
        km::ApiVersionsRequest::default()
            .with_client_software_name(st("canopy-test"))
            .with_client_software_version(st("1.0"))
    }

    fn metadata(v: i16) -> km::MetadataRequest {
        use km::metadata_request::*;
        let mut r = MetadataRequest::default().with_topics(Some(two(|i| {
            let mut t = MetadataRequestTopic::default().with_name(Some(topic(i)));
            t.topic_id = uuid!();
            t.unknown_tagged_fields = extra();
            t
        })));
        if v >= 4 {
            r.allow_auto_topic_creation = false;
        }
        if (8..=10).contains(&v) {
            r.include_cluster_authorized_operations = true;
        }
        if v >= 8 {
            r.include_topic_authorized_operations = true;
        }
        r
    }

    fn produce(_v: i16) -> km::ProduceRequest {
        use km::produce_request::*;
        ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(st("tx-1"))))
            .with_acks(-1)
            .with_timeout_ms(1000)
            .with_topic_data(two(|i| {
                let mut t = TopicProduceData::default()
                    .with_name(topic(i))
                    .with_topic_id(uuid!())
                    .with_partition_data(two(|p| {
                        PartitionProduceData::default()
                            .with_index(p as i32)
                            .with_records(Some(Bytes::from_static(b"opaque record batch")))
                    }));
                t.unknown_tagged_fields = extra();
                t
            }))
    }

    fn fetch(v: i16) -> km::FetchRequest {
        use km::fetch_request::*;
        let mut r = FetchRequest::default()
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_isolation_level(1)
            .with_session_id(3)
            .with_session_epoch(4)
            .with_rack_id(st("rack-a"))
            .with_topics(two(|i| {
                FetchTopic::default()
                    .with_topic(topic(i))
                    .with_topic_id(uuid!())
                    .with_partitions(two(|p| {
                        let mut x = FetchPartition::default()
                            .with_partition(p as i32)
                            .with_current_leader_epoch(2)
                            .with_fetch_offset(100)
                            .with_log_start_offset(0)
                            .with_partition_max_bytes(1024);
                        if v >= 12 {
                            x.last_fetched_epoch = 1;
                            x.unknown_tagged_fields = extra();
                        }
                        if v >= 17 {
                            x.replica_directory_id = uuid!();
                        }
                        if v >= 18 {
                            x.high_watermark = 42;
                        }
                        x
                    }))
            }));
        if v <= 14 {
            r.replica_id = BrokerId(5);
        }
        if v >= 7 {
            r.forgotten_topics_data = two(|i| {
                ForgottenTopic::default()
                    .with_topic(topic(i))
                    .with_topic_id(uuid!())
                    .with_partitions(vec![1, 2])
            });
        }
        if v >= 12 {
            r.cluster_id = Some(st("cluster-1"));
        }
        if v >= 15 {
            r.replica_state = ReplicaState::default()
                .with_replica_id(BrokerId(3))
                .with_replica_epoch(9);
        }
        r
    }

    fn list_offsets(v: i16) -> km::ListOffsetsRequest {
        use km::list_offsets_request::*;
        let mut r = ListOffsetsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(two(|i| {
                ListOffsetsTopic::default()
                    .with_name(topic(i))
                    .with_partitions(two(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(p as i32)
                            .with_current_leader_epoch(1)
                            .with_timestamp(-1)
                    }))
            }));
        if v >= 2 {
            r.isolation_level = 1;
        }
        r
    }

    fn offset_for_leader_epoch(_v: i16) -> km::OffsetForLeaderEpochRequest {
        use km::offset_for_leader_epoch_request::*;
        OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-2))
            .with_topics(two(|i| {
                OffsetForLeaderTopic::default()
                    .with_topic(topic(i))
                    .with_partitions(two(|p| {
                        OffsetForLeaderPartition::default()
                            .with_partition(p as i32)
                            .with_current_leader_epoch(3)
                            .with_leader_epoch(2)
                    }))
            }))
    }

    fn create_topics(_v: i16) -> km::CreateTopicsRequest {
        use km::create_topics_request::*;
        CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_validate_only(true)
            .with_topics(two(|i| {
                CreatableTopic::default()
                    .with_name(topic(i))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(two(|p| {
                        CreatableReplicaAssignment::default()
                            .with_partition_index(p as i32)
                            .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
                    }))
                    .with_configs(two(|c| {
                        CreatableTopicConfig::default()
                            .with_name(st("cleanup.policy"))
                            .with_value([Some(st("compact")), None][c].clone())
                    }))
            }))
    }

    fn delete_topics(v: i16) -> km::DeleteTopicsRequest {
        use km::delete_topics_request::*;
        let mut r = DeleteTopicsRequest::default().with_timeout_ms(30_000);
        if v >= 6 {
            r.topics = two(|i| {
                DeleteTopicState::default()
                    .with_name(Some(topic(i)))
                    .with_topic_id(uuid!())
            });
        } else {
            r.topic_names = two(topic);
        }
        r
    }

    fn create_partitions(_v: i16) -> km::CreatePartitionsRequest {
        use km::create_partitions_request::*;
        CreatePartitionsRequest::default()
            .with_timeout_ms(1000)
            .with_validate_only(true)
            .with_topics(two(|i| {
                CreatePartitionsTopic::default()
                    .with_name(topic(i))
                    .with_count(4)
                    .with_assignments(Some(two(|_| {
                        CreatePartitionsAssignment::default()
                            .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
                    })))
            }))
    }

    fn describe_configs(v: i16) -> km::DescribeConfigsRequest {
        use km::describe_configs_request::*;
        let mut r = DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_resources(two(|i| {
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(topic(i).0)
                    .with_configuration_keys([Some(vec![st("a"), st("b")]), None][i].clone())
            }));
        if v >= 3 {
            r.include_documentation = true;
        }
        r
    }

    fn alter_configs(_v: i16) -> km::AlterConfigsRequest {
        use km::alter_configs_request::*;
        AlterConfigsRequest::default()
            .with_validate_only(true)
            .with_resources(two(|i| {
                AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(topic(i).0)
                    .with_configs(two(|c| {
                        AlterableConfig::default()
                            .with_name(st("retention.ms"))
                            .with_value([Some(st("1000")), None][c].clone())
                    }))
            }))
    }

    fn incremental_alter_configs(_v: i16) -> km::IncrementalAlterConfigsRequest {
        use km::incremental_alter_configs_request::*;
        IncrementalAlterConfigsRequest::default()
            .with_validate_only(true)
            .with_resources(two(|i| {
                AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(topic(i).0)
                    .with_configs(two(|c| {
                        AlterableConfig::default()
                            .with_name(st("retention.ms"))
                            .with_config_operation(c as i8)
                            .with_value([Some(st("1000")), None][c].clone())
                    }))
            }))
    }

    fn describe_cluster(v: i16) -> km::DescribeClusterRequest {
        let mut r =
            km::DescribeClusterRequest::default().with_include_cluster_authorized_operations(true);
        if v >= 1 {
            r.endpoint_type = 2;
        }
        if v >= 2 {
            r.include_fenced_brokers = true;
        }
        r
    }

    fn find_coordinator(v: i16) -> km::FindCoordinatorRequest {
        let mut r = km::FindCoordinatorRequest::default();
        if v <= 3 {
            r.key = st("group-1");
        }
        if v >= 1 {
            r.key_type = 1;
        }
        if v >= 4 {
            r.coordinator_keys = vec![st("tx-1"), st("tx-2")];
        }
        r
    }

    fn join_group(v: i16) -> km::JoinGroupRequest {
        use km::join_group_request::*;
        let mut r = JoinGroupRequest::default()
            .with_group_id(group())
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(30_000)
            .with_member_id(st("member-1"))
            .with_protocol_type(st("consumer"))
            .with_reason(Some(st("rejoin")))
            .with_protocols(two(|i| {
                JoinGroupRequestProtocol::default()
                    .with_name(st(["range", "cooperative-sticky"][i]))
                    .with_metadata(Bytes::from_static(b"\x00\x03subscription"))
            }));
        if v >= 5 {
            r.group_instance_id = Some(st("instance-1"));
        }
        r
    }

    fn sync_group(v: i16) -> km::SyncGroupRequest {
        use km::sync_group_request::*;
        let mut r = SyncGroupRequest::default()
            .with_group_id(group())
            .with_generation_id(7)
            .with_member_id(st("member-1"))
            .with_protocol_type(Some(st("consumer")))
            .with_protocol_name(Some(st("range")))
            .with_assignments(two(|i| {
                SyncGroupRequestAssignment::default()
                    .with_member_id(st(["member-1", "member-2"][i]))
                    .with_assignment(Bytes::from_static(b"\x00\x03assignment"))
            }));
        if v >= 3 {
            r.group_instance_id = Some(st("instance-1"));
        }
        r
    }

    fn heartbeat(v: i16) -> km::HeartbeatRequest {
        let mut r = km::HeartbeatRequest::default()
            .with_group_id(group())
            .with_generation_id(7)
            .with_member_id(st("member-1"));
        if v >= 3 {
            r.group_instance_id = Some(st("instance-1"));
        }
        r
    }

    fn leave_group(v: i16) -> km::LeaveGroupRequest {
        use km::leave_group_request::*;
        let mut r = LeaveGroupRequest::default().with_group_id(group());
        if v <= 2 {
            r.member_id = st("member-1");
        } else {
            r.members = two(|i| {
                MemberIdentity::default()
                    .with_member_id(st(["member-1", "member-2"][i]))
                    .with_group_instance_id([Some(st("instance-1")), None][i].clone())
                    .with_reason(Some(st("shutdown")))
            });
        }
        r
    }

    fn offset_commit(v: i16) -> km::OffsetCommitRequest {
        use km::offset_commit_request::*;
        let mut r = OffsetCommitRequest::default()
            .with_group_id(group())
            .with_generation_id_or_member_epoch(7)
            .with_member_id(st("member-1"))
            .with_retention_time_ms(60_000)
            .with_topics(two(|i| {
                OffsetCommitRequestTopic::default()
                    .with_name(topic(i))
                    .with_partitions(two(|p| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p as i32)
                            .with_committed_offset(1234)
                            .with_committed_leader_epoch(3)
                            .with_committed_metadata([Some(st("meta")), None][p].clone())
                    }))
            }));
        if v >= 7 {
            r.group_instance_id = Some(st("instance-1"));
        }
        r
    }

    fn offset_fetch(v: i16) -> km::OffsetFetchRequest {
        use km::offset_fetch_request::*;
        let mut r = OffsetFetchRequest::default();
        if v <= 7 {
            r.group_id = group();
            r.topics = Some(two(|i| {
                OffsetFetchRequestTopic::default()
                    .with_name(topic(i))
                    .with_partition_indexes(vec![0, 1])
            }));
        } else {
            r.groups = two(|g| {
                let mut x = OffsetFetchRequestGroup::default()
                    .with_group_id(group())
                    .with_topics(
                        [
                            Some(two(|i| {
                                OffsetFetchRequestTopics::default()
                                    .with_name(topic(i))
                                    .with_partition_indexes(vec![0, 1])
                            })),
                            None,
                        ][g]
                            .clone(),
                    );
                if v >= 9 {
                    x.member_id = Some(st("member-1"));
                    x.member_epoch = 5;
                }
                x
            });
        }
        if v >= 7 {
            r.require_stable = true;
        }
        r
    }

    fn list_groups(v: i16) -> km::ListGroupsRequest {
        let mut r = km::ListGroupsRequest::default();
        if v >= 4 {
            r.states_filter = vec![st("Stable"), st("Empty")];
        }
        if v >= 5 {
            r.types_filter = vec![st("classic"), st("consumer")];
        }
        r
    }

    fn describe_groups(v: i16) -> km::DescribeGroupsRequest {
        let mut r =
            km::DescribeGroupsRequest::default().with_groups(vec![group(), GroupId(st("g2"))]);
        if v >= 3 {
            r.include_authorized_operations = true;
        }
        r
    }

    fn delete_groups(_v: i16) -> km::DeleteGroupsRequest {
        km::DeleteGroupsRequest::default().with_groups_names(vec![group(), GroupId(st("g2"))])
    }

    fn offset_delete(_v: i16) -> km::OffsetDeleteRequest {
        use km::offset_delete_request::*;
        OffsetDeleteRequest::default()
            .with_group_id(group())
            .with_topics(two(|i| {
                OffsetDeleteRequestTopic::default()
                    .with_name(topic(i))
                    .with_partitions(two(|p| {
                        OffsetDeleteRequestPartition::default().with_partition_index(p as i32)
                    }))
            }))
    }

    fn init_producer_id(v: i16) -> km::InitProducerIdRequest {
        let mut r = km::InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(st("tx-1"))))
            .with_transaction_timeout_ms(60_000);
        if v >= 3 {
            r.producer_id = ProducerId(77);
            r.producer_epoch = 2;
        }
        r
    }

    fn add_partitions_to_txn(v: i16) -> km::AddPartitionsToTxnRequest {
        use km::add_partitions_to_txn_request::*;
        let topics = || {
            two(|i| {
                AddPartitionsToTxnTopic::default()
                    .with_name(topic(i))
                    .with_partitions(vec![0, 1])
            })
        };
        let mut r = AddPartitionsToTxnRequest::default();
        if v <= 3 {
            r.v3_and_below_transactional_id = TransactionalId(st("tx-1"));
            r.v3_and_below_producer_id = ProducerId(77);
            r.v3_and_below_producer_epoch = 2;
            r.v3_and_below_topics = topics();
        } else {
            r.transactions = two(|i| {
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(st(["tx-1", "tx-2"][i])))
                    .with_producer_id(ProducerId(77))
                    .with_producer_epoch(2)
                    .with_verify_only(true)
                    .with_topics(topics())
            });
        }
        r
    }

    fn add_offsets_to_txn(_v: i16) -> km::AddOffsetsToTxnRequest {
        km::AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(st("tx-1")))
            .with_producer_id(ProducerId(77))
            .with_producer_epoch(2)
            .with_group_id(group())
    }

    fn end_txn(_v: i16) -> km::EndTxnRequest {
        km::EndTxnRequest::default()
            .with_transactional_id(TransactionalId(st("tx-1")))
            .with_producer_id(ProducerId(77))
            .with_producer_epoch(2)
            .with_committed(true)
    }

    fn txn_offset_commit(v: i16) -> km::TxnOffsetCommitRequest {
        use km::txn_offset_commit_request::*;
        let mut r = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(st("tx-1")))
            .with_group_id(group())
            .with_producer_id(ProducerId(77))
            .with_producer_epoch(2)
            .with_topics(two(|i| {
                TxnOffsetCommitRequestTopic::default()
                    .with_name(topic(i))
                    .with_partitions(two(|p| {
                        TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(p as i32)
                            .with_committed_offset(99)
                            .with_committed_leader_epoch(4)
                            .with_committed_metadata([Some(st("meta")), None][p].clone())
                    }))
            }));
        if v >= 3 {
            r.generation_id = 7;
            r.member_id = st("member-1");
            r.group_instance_id = Some(st("instance-1"));
        }
        r
    }

    fn describe_transactions(_v: i16) -> km::DescribeTransactionsRequest {
        km::DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(st("tx-1")), TransactionalId(st("tx-2"))])
    }

    fn list_transactions(v: i16) -> km::ListTransactionsRequest {
        let mut r = km::ListTransactionsRequest::default()
            .with_state_filters(vec![st("Ongoing"), st("Empty")])
            .with_producer_id_filters(vec![ProducerId(5), ProducerId(6)]);
        if v >= 1 {
            r.duration_filter = 1000;
        }
        if v >= 2 {
            r.transactional_id_pattern = Some(st("tx-.*"));
        }
        r
    }

    fn delete_records(_v: i16) -> km::DeleteRecordsRequest {
        use km::delete_records_request::*;
        DeleteRecordsRequest::default()
            .with_timeout_ms(1000)
            .with_topics(two(|i| {
                DeleteRecordsTopic::default()
                    .with_name(topic(i))
                    .with_partitions(two(|p| {
                        DeleteRecordsPartition::default()
                            .with_partition_index(p as i32)
                            .with_offset(10)
                    }))
            }))
    }

    fn sasl_handshake(_v: i16) -> km::SaslHandshakeRequest {
        km::SaslHandshakeRequest::default().with_mechanism(st("PLAIN"))
    }

    fn sasl_authenticate(_v: i16) -> km::SaslAuthenticateRequest {
        km::SaslAuthenticateRequest::default()
            .with_auth_bytes(Bytes::from_static(b"\x00user\x00password"))
    }

    // ---- one case per API ---------------------------------------------------

    struct Case {
        key: i16,
        name: &'static str,
        versions: VersionRange,
        /// The populated request (plus an unknown tagged field) at a version.
        populated: fn(i16) -> Vec<u8>,
        /// `Default::default()` at a version.
        empty: fn(i16) -> Vec<u8>,
        /// kafka-protocol's decoder: bytes consumed, or its error.
        decode: fn(&[u8], i16) -> Result<usize, String>,
    }

    fn encode<T: Encodable>(req: &T, version: i16) -> Vec<u8> {
        let mut buf = BytesMut::new();
        req.encode(&mut buf, version)
            .unwrap_or_else(|e| panic!("encode v{version}: {e}"));
        buf.to_vec()
    }

    macro_rules! case {
        (@make $ty:ident, $build:expr) => {
            Case {
                key: <km::$ty as Request>::KEY,
                name: stringify!($ty),
                versions: <km::$ty as Message>::VERSIONS,
                populated: |v| encode(&($build)(v), v),
                empty: |v| encode(&km::$ty::default(), v),
                decode: |body, v| {
                    let mut rest = body;
                    <km::$ty as Decodable>::decode(&mut rest, v)
                        .map(|_| body.len() - rest.len())
                        .map_err(|e| e.to_string())
                },
            }
        };
        ($ty:ident, $build:ident) => {
            case!(@make $ty, |v| {
                let mut req = $build(v);
                req.unknown_tagged_fields = extra();
                req
            })
        };
        // APIs without flexible versions have no tagged fields.
        ($ty:ident, $build:ident, never_flexible) => {
            case!(@make $ty, $build)
        };
    }

    fn cases() -> Vec<Case> {
        vec![
            case!(ApiVersionsRequest, api_versions),
            case!(MetadataRequest, metadata),
            case!(ProduceRequest, produce),
            case!(FetchRequest, fetch),
            case!(ListOffsetsRequest, list_offsets),
            case!(OffsetForLeaderEpochRequest, offset_for_leader_epoch),
            case!(CreateTopicsRequest, create_topics),
            case!(DeleteTopicsRequest, delete_topics),
            case!(CreatePartitionsRequest, create_partitions),
            case!(DescribeConfigsRequest, describe_configs),
            case!(AlterConfigsRequest, alter_configs),
            case!(IncrementalAlterConfigsRequest, incremental_alter_configs),
            case!(DescribeClusterRequest, describe_cluster),
            case!(FindCoordinatorRequest, find_coordinator),
            case!(JoinGroupRequest, join_group),
            case!(SyncGroupRequest, sync_group),
            case!(HeartbeatRequest, heartbeat),
            case!(LeaveGroupRequest, leave_group),
            case!(OffsetCommitRequest, offset_commit),
            case!(OffsetFetchRequest, offset_fetch),
            case!(ListGroupsRequest, list_groups),
            case!(DescribeGroupsRequest, describe_groups),
            case!(DeleteGroupsRequest, delete_groups),
            case!(OffsetDeleteRequest, offset_delete, never_flexible),
            case!(InitProducerIdRequest, init_producer_id),
            case!(AddPartitionsToTxnRequest, add_partitions_to_txn),
            case!(AddOffsetsToTxnRequest, add_offsets_to_txn),
            case!(EndTxnRequest, end_txn),
            case!(TxnOffsetCommitRequest, txn_offset_commit),
            case!(DescribeTransactionsRequest, describe_transactions),
            case!(ListTransactionsRequest, list_transactions),
            case!(DeleteRecordsRequest, delete_records),
            case!(SaslHandshakeRequest, sasl_handshake, never_flexible),
            case!(SaslAuthenticateRequest, sasl_authenticate),
        ]
    }

    struct Sample {
        case: usize,
        version: i16,
        what: &'static str,
        body: Vec<u8>,
    }

    /// Every API × every version × {populated, default}.
    fn samples(cases: &[Case]) -> Vec<Sample> {
        let mut out = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            for version in case.versions.min..=case.versions.max {
                out.push(Sample {
                    case: i,
                    version,
                    what: "populated",
                    body: (case.populated)(version),
                });
                out.push(Sample {
                    case: i,
                    version,
                    what: "default",
                    body: (case.empty)(version),
                });
            }
        }
        out
    }

    /// Built once: encoding every sample for every proptest case is slow.
    fn all() -> &'static (Vec<Case>, Vec<Sample>) {
        static ALL: std::sync::OnceLock<(Vec<Case>, Vec<Sample>)> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            let cases = cases();
            let samples = samples(&cases);
            (cases, samples)
        })
    }

    fn check(case: &Case, version: i16, body: &[u8]) -> Result<(), GuardError> {
        check_request_body(case.key, version, body, &GuardLimits::DEFAULT)
    }

    /// The guard against the crate's decoder on one body. The decoder runs only
    /// where the guard proved it safe: accepted bodies, and rejections at which
    /// the decoder must stop too (it would otherwise reserve what a bad count
    /// says, which is what the guard exists to prevent).
    fn assert_agrees(case: &Case, version: i16, body: &[u8]) {
        let guard = check(case, version, body);
        let ctx = || format!("{} v{version} {body:02x?}: guard {guard:?}", case.name);
        match guard {
            Ok(()) => assert_eq!((case.decode)(body, version), Ok(body.len()), "{}", ctx()),
            Err(GuardError::TrailingBytes { offset, .. }) => {
                assert_eq!((case.decode)(body, version), Ok(offset), "{}", ctx())
            }
            Err(
                GuardError::InvalidUtf8 { .. }
                | GuardError::UnexpectedNull { .. }
                | GuardError::Negative { .. }
                | GuardError::TagNotValid { .. },
            ) => assert!((case.decode)(body, version).is_err(), "{}", ctx()),
            Err(_) => {}
        }
    }

    // ---- the tables are the crate's ----------------------------------------

    #[test]
    fn tables_cover_exactly_the_crate_versions() {
        let cases = cases();
        assert_eq!(cases.len(), APIS.len());
        for case in &cases {
            let api = APIS.iter().find(|api| api.key == case.key).unwrap();
            assert_eq!(format!("{}Request", api.name), case.name);
            assert_eq!(
                (api.min, api.max),
                (case.versions.min, case.versions.max),
                "{}",
                case.name
            );
            assert_eq!(supported_versions(case.key), Some((api.min, api.max)));
            assert_eq!(api.schema.name, case.name);
        }
        let mut keys: Vec<i16> = APIS.iter().map(|api| api.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), APIS.len(), "duplicate api key");
        assert_eq!(guarded_apis().count(), APIS.len());
    }

    #[test]
    fn schema_depth_fits_the_default_limit() {
        fn depth(schema: &Schema) -> usize {
            let inner = |ty: Ty| match ty {
                Ty::Struct(s)
                | Ty::Array {
                    elem: Elem::Struct(s),
                    ..
                } => depth(s),
                _ => 0,
            };
            let fields = schema.fields.iter().map(|f| inner(f.ty));
            let tagged = schema.tagged.iter().map(|t| inner(t.ty));
            1 + fields.chain(tagged).max().unwrap_or(0)
        }
        let deepest = APIS.iter().map(|api| depth(api.schema)).max().unwrap();
        assert_eq!(deepest, MAX_SCHEMA_DEPTH);
    }

    #[test]
    fn every_version_of_every_api_is_accepted_whole() {
        let cases = cases();
        let samples = samples(&cases);
        assert!(samples.len() > 300, "{}", samples.len());
        for s in &samples {
            let case = &cases[s.case];
            let ctx = format!("{} v{} {}", case.name, s.version, s.what);
            assert_eq!(check(case, s.version, &s.body), Ok(()), "{ctx}");
            assert_eq!((case.decode)(&s.body, s.version), Ok(s.body.len()), "{ctx}");
        }
    }

    #[test]
    fn every_strict_prefix_is_truncated() {
        let cases = cases();
        for s in samples(&cases) {
            let case = &cases[s.case];
            for cut in 0..s.body.len() {
                let got = check(case, s.version, &s.body[..cut]);
                assert!(
                    matches!(got, Err(GuardError::Truncated { .. })),
                    "{} v{} {} cut at {cut}: {got:?}",
                    case.name,
                    s.version,
                    s.what
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let cases = cases();
        for s in samples(&cases) {
            let case = &cases[s.case];
            let mut body = s.body.clone();
            body.push(0);
            let want = GuardError::TrailingBytes {
                offset: s.body.len(),
                remaining: 1,
            };
            assert_eq!(
                check(case, s.version, &body),
                Err(want),
                "{} v{}",
                case.name,
                s.version
            );
        }
    }

    /// Every single-byte change of every sample, at values that hit length
    /// edges: the guard and the decoder agree wherever the decoder may run.
    #[test]
    fn single_byte_mutations_agree_with_the_crate() {
        let cases = cases();
        for s in samples(&cases) {
            let case = &cases[s.case];
            for pos in 0..s.body.len() {
                for byte in [0x00, 0x01, 0x02, 0x7f, 0x80, 0xc3, 0xfe, 0xff] {
                    let mut body = s.body.clone();
                    body[pos] = byte;
                    assert_agrees(case, s.version, &body);
                }
            }
        }
    }

    // ---- huge counts and lengths ------------------------------------------

    /// The smallest encoding of `ty`: zeros, empty strings, empty arrays.
    fn minimal(ty: Ty, version: i16, flexible: bool, out: &mut Vec<u8>) {
        let prefix: &[u8] = match (flexible, ty) {
            (_, Ty::Fixed(width)) => &[0; 16][..width],
            (true, Ty::Str { .. } | Ty::Bytes { .. } | Ty::Array { .. }) => &[1],
            (false, Ty::Str { .. }) => &[0, 0],
            (false, Ty::Bytes { .. } | Ty::Array { .. }) => &[0, 0, 0, 0],
            (_, Ty::Struct(schema)) => {
                for field in schema
                    .fields
                    .iter()
                    .filter(|f| (f.min..=f.max).contains(&version))
                {
                    minimal(field.ty, version, flexible, out);
                }
                if flexible {
                    out.push(0);
                }
                &[]
            }
        };
        out.extend_from_slice(prefix);
    }

    fn huge_prefix(ty: Ty, flexible: bool) -> &'static [u8] {
        match (flexible, ty) {
            (true, _) => &[0xff, 0xff, 0xff, 0xff, 0x0f],
            (false, Ty::Str { .. }) => &[0x7f, 0xff],
            (false, _) => &[0x7f, 0xff, 0xff, 0xff],
        }
    }

    #[test]
    fn minimal_bodies_are_accepted_and_decode() {
        let cases = cases();
        for api in APIS {
            let case = cases.iter().find(|c| c.key == api.key).unwrap();
            for version in api.min..=api.max {
                let flexible = version >= api.flexible;
                let mut body = Vec::new();
                minimal(Ty::Struct(api.schema), version, flexible, &mut body);
                let walker = Walker {
                    buf: &[],
                    pos: 0,
                    end: 0,
                    version,
                    flexible,
                    limits: &GuardLimits::DEFAULT,
                    elements_left: 0,
                };
                assert_eq!(walker.min_size(Ty::Struct(api.schema)), body.len() as u64);
                assert_eq!(
                    check(case, version, &body),
                    Ok(()),
                    "{} v{version}",
                    api.name
                );
                assert_eq!(
                    (case.decode)(&body, version),
                    Ok(body.len()),
                    "{} v{version}",
                    api.name
                );
            }
        }
    }

    /// For every top-level array, string and bytes field of every API and
    /// version: a body whose prefix for that field claims 0x7fffffff (or a
    /// varint of 0xffffffff) is refused at that field, with the default
    /// limits and with no limits at all.
    #[test]
    fn huge_top_level_counts_and_lengths_are_rejected() {
        let unlimited = GuardLimits {
            max_array_len: usize::MAX,
            max_string_len: usize::MAX,
            max_bytes_len: usize::MAX,
            max_tagged_fields: usize::MAX,
            max_elements: usize::MAX,
            max_depth: usize::MAX,
        };
        let mut arrays_seen = 0;
        for api in APIS {
            for version in api.min..=api.max {
                let flexible = version >= api.flexible;
                let present: Vec<&Field> = api
                    .schema
                    .fields
                    .iter()
                    .filter(|f| (f.min..=f.max).contains(&version))
                    .collect();
                for (i, field) in present.iter().enumerate() {
                    if matches!(field.ty, Ty::Fixed(_) | Ty::Struct(_)) {
                        continue;
                    }
                    let mut body = Vec::new();
                    for before in &present[..i] {
                        minimal(before.ty, version, flexible, &mut body);
                    }
                    body.extend_from_slice(huge_prefix(field.ty, flexible));
                    for after in &present[i + 1..] {
                        minimal(after.ty, version, flexible, &mut body);
                    }
                    if flexible {
                        body.push(0);
                    }
                    let is_array = matches!(field.ty, Ty::Array { .. });
                    arrays_seen += usize::from(is_array);
                    // With the defaults the limits trip first, except for a
                    // classic string, whose largest length (0x7fff) is allowed.
                    let classic_str = !flexible && matches!(field.ty, Ty::Str { .. });
                    for (limits, limited) in
                        [(&GuardLimits::DEFAULT, !classic_str), (&unlimited, false)]
                    {
                        let got = check_request_body(api.key, version, &body, limits);
                        let ctx = format!("{} v{version} {}: {got:?}", api.name, field.name);
                        let at = match got {
                            Err(GuardError::CountTooLarge { at, .. }) if limited && is_array => at,
                            Err(GuardError::LengthTooLarge { at, .. }) if limited && !is_array => {
                                at
                            }
                            Err(GuardError::Truncated { at, .. }) if !limited => at,
                            _ => panic!("{ctx}"),
                        };
                        assert_eq!(
                            (at.schema, at.field),
                            (api.schema.name, field.name),
                            "{ctx}"
                        );
                    }
                }
            }
        }
        assert!(arrays_seen > 100, "{arrays_seen}");
    }

    #[test]
    fn explicit_huge_counts() {
        let limits = GuardLimits::DEFAULT;
        // Metadata v0: topics = 0x7fffffff.
        let got = check_request_body(3, 0, &[0x7f, 0xff, 0xff, 0xff], &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::CountTooLarge {
                    count: 0x7fff_ffff,
                    ..
                })
            ),
            "{got:?}"
        );
        // Metadata v12 (compact): topics = varint 0xffffffff, i.e. 0xfffffffe entries.
        let got = check_request_body(3, 12, &[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0], &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::CountTooLarge {
                    count: 0xffff_fffe,
                    ..
                })
            ),
            "{got:?}"
        );
        // Within the count limit but not within the bytes: 1000 topics in 10 bytes.
        let mut body = vec![0, 0, 0x03, 0xe8];
        body.extend_from_slice(&[0; 10]);
        let got = check_request_body(3, 0, &body, &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::Truncated {
                    needed: 2000,
                    remaining: 10,
                    ..
                })
            ),
            "{got:?}"
        );
        // Produce v3 records of 0x7fffffff bytes.
        let mut body = vec![
            0xff, 0xff, 0, 1, 0, 0, 0, 10, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0,
        ];
        body.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff, 1, 2, 3]);
        let got = check_request_body(0, 3, &body, &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::LengthTooLarge {
                    len: 0x7fff_ffff,
                    ..
                })
            ),
            "{got:?}"
        );
        // Tagged-field sections: a huge count, then a huge size.
        let got = check_request_body(18, 3, &[1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f], &limits);
        assert!(
            matches!(got, Err(GuardError::CountTooLarge { .. })),
            "{got:?}"
        );
        let got = check_request_body(18, 3, &[1, 1, 1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f], &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::Truncated {
                    needed: 0xffff_ffff,
                    ..
                })
            ),
            "{got:?}"
        );
    }

    #[test]
    fn malformed_lengths_are_named() {
        let limits = GuardLimits::DEFAULT;
        // A sixth varint byte, and a fifth with bits beyond u32.
        for body in [
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..],
            &[0x80, 0x80, 0x80, 0x80, 0x10],
        ] {
            let got = check_request_body(3, 12, body, &limits);
            assert!(
                matches!(got, Err(GuardError::BadVarint { offset: 0, .. })),
                "{got:?}"
            );
        }
        // SaslHandshake mechanism: -2 and null.
        let got = check_request_body(17, 0, &[0xff, 0xfe], &limits);
        assert!(
            matches!(got, Err(GuardError::Negative { value: -2, .. })),
            "{got:?}"
        );
        let got = check_request_body(17, 0, &[0xff, 0xff], &limits);
        assert!(
            matches!(got, Err(GuardError::UnexpectedNull { .. })),
            "{got:?}"
        );
        let got = check_request_body(17, 0, &[0, 2, 0xc3, 0x28], &limits);
        assert!(
            matches!(got, Err(GuardError::InvalidUtf8 { offset: 2, .. })),
            "{got:?}"
        );
    }

    #[test]
    fn known_tagged_fields_are_checked() {
        let limits = GuardLimits::DEFAULT;
        // Fetch v12 body: 25 bytes of fixed fields, empty topics, forgotten and
        // rack, then the tagged fields.
        let head = [0u8; 4 * 4 + 1 + 4 * 2]
            .iter()
            .copied()
            .chain([1, 1, 1])
            .collect::<Vec<u8>>();
        let with_tags = |tags: &[u8]| [&head[..], tags].concat();
        // cluster_id (tag 0) = "abc": accepted.
        assert_eq!(
            check_request_body(1, 12, &with_tags(&[1, 0, 4, 4, b'a', b'b', b'c']), &limits),
            Ok(())
        );
        // Declared size 5 but the string fills 4.
        let got = check_request_body(
            1,
            12,
            &with_tags(&[1, 0, 5, 4, b'a', b'b', b'c', 0]),
            &limits,
        );
        assert!(
            matches!(
                got,
                Err(GuardError::TaggedSizeMismatch {
                    declared: 5,
                    actual: 4,
                    ..
                })
            ),
            "{got:?}"
        );
        // Declared size 2 but the string needs 4.
        let got = check_request_body(1, 12, &with_tags(&[1, 0, 2, 4, b'a', b'b', b'c']), &limits);
        assert!(matches!(got, Err(GuardError::Truncated { .. })), "{got:?}");
        // replica_state (tag 1) exists only from v15.
        let got = check_request_body(1, 12, &with_tags(&[1, 1, 1, 0]), &limits);
        assert!(
            matches!(
                got,
                Err(GuardError::TagNotValid {
                    tag: 1,
                    version: 12,
                    ..
                })
            ),
            "{got:?}"
        );
        // An unknown tag is skipped whatever it holds.
        assert_eq!(
            check_request_body(1, 12, &with_tags(&[1, 42, 3, 0xff, 0xff, 0xff]), &limits),
            Ok(())
        );
    }

    #[test]
    fn limits_are_enforced() {
        let cases = cases();
        let fetch = cases.iter().find(|c| c.key == 1).unwrap();
        let body = (fetch.populated)(18);
        let with = |change: fn(&mut GuardLimits)| {
            let mut limits = GuardLimits::DEFAULT;
            change(&mut limits);
            check_request_body(1, 18, &body, &limits)
        };
        assert_eq!(with(|_| {}), Ok(()));
        let got = with(|l| l.max_array_len = 1);
        assert!(
            matches!(
                got,
                Err(GuardError::CountTooLarge {
                    count: 2,
                    limit: 1,
                    ..
                })
            ),
            "{got:?}"
        );
        let got = with(|l| l.max_elements = 5);
        assert!(
            matches!(got, Err(GuardError::CountTooLarge { limit: 1, .. })),
            "{got:?}"
        );
        let got = with(|l| l.max_string_len = 3);
        assert!(
            matches!(got, Err(GuardError::LengthTooLarge { limit: 3, .. })),
            "{got:?}"
        );
        let got = with(|l| l.max_tagged_fields = 0);
        assert!(
            matches!(got, Err(GuardError::CountTooLarge { limit: 0, .. })),
            "{got:?}"
        );
        let got = with(|l| l.max_depth = 2);
        assert!(
            matches!(
                got,
                Err(GuardError::TooDeep {
                    schema: "FetchPartition",
                    limit: 2
                })
            ),
            "{got:?}"
        );
        let produce = cases.iter().find(|c| c.key == 0).unwrap();
        let mut limits = GuardLimits::DEFAULT;
        limits.max_bytes_len = 4;
        let got = check_request_body(0, 9, &(produce.populated)(9), &limits);
        assert!(
            matches!(got, Err(GuardError::LengthTooLarge { limit: 4, .. })),
            "{got:?}"
        );
    }

    #[test]
    fn unknown_apis_and_versions_are_refused() {
        let limits = GuardLimits::DEFAULT;
        assert_eq!(
            check_request_body(1000, 0, &[], &limits),
            Err(GuardError::UnsupportedApi { api_key: 1000 })
        );
        assert_eq!(
            check_request_body(0, 2, &[], &limits),
            Err(GuardError::UnsupportedVersion {
                api_key: 0,
                api_version: 2,
                min: 3,
                max: 13
            })
        );
        assert_eq!(supported_versions(1000), None);
    }

    // ---- fuzzing -------------------------------------------------------------

    fn api_key() -> impl Strategy<Value = i16> {
        prop_oneof![
            4 => proptest::sample::select(APIS.iter().map(|api| api.key).collect::<Vec<_>>()),
            1 => any::<i16>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bodies_never_panic(
            key in api_key(),
            version in -1i16..20,
            body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let got = check_request_body(key, version, &body, &GuardLimits::DEFAULT);
            if let Some(case) = all().0.iter().find(|c| c.key == key) {
                if got.is_ok() {
                    prop_assert_eq!((case.decode)(&body, version), Ok(body.len()));
                }
            }
        }

        #[test]
        fn mutated_samples_agree_with_the_crate(
            pick in any::<proptest::sample::Index>(),
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<proptest::sample::Index>(),
        ) {
            let (cases, samples) = all();
            let s = pick.get(samples);
            let mut body = s.body.clone();
            if body.is_empty() {
                return Ok(());
            }
            for (at, byte) in &edits {
                let i = at.index(body.len());
                body[i] = *byte;
            }
            assert_agrees(&cases[s.case], s.version, &body);
            // and the same with a random tail cut off
            let keep = cut.index(body.len() + 1);
            assert_agrees(&cases[s.case], s.version, &body[..keep]);
        }
    }
}
