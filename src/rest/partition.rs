//! Choosing a partition the way Kafka producers do, so a record posted over
//! HTTP with a key lands where a Kafka producer with that key would put it.
//!
//! Keyed records: the Java client's default partitioner (and librdkafka's
//! `murmur2_random`): `toPositive(murmur2(key)) % partitions`. Records
//! without a key stick to one partition per topic for a while, then move
//! on round-robin (the "sticky" partitioner's spirit, without batching
//! state).

use std::sync::atomic::{AtomicU64, Ordering};

/// Kafka's murmur2 (the Java client's `Utils.murmur2`): seed 0x9747b28c,
/// little-endian 4-byte blocks, the tail mixed in from its high byte down.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ len as u32;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a keyed record.
pub fn for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Spreads keyless records: every `STICK` records move to the next
/// partition.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

const STICK: u64 = 64;

impl RoundRobin {
    pub fn pick(&self, partitions: i32) -> i32 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        ((n / STICK) % partitions.max(1) as u64) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Values from Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 5] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ];
        for (data, want) in cases {
            assert_eq!(murmur2(data), want, "{}", String::from_utf8_lossy(data));
        }
        assert_eq!(murmur2(b"abc"), 479470107);
        assert!((0..10).contains(&for_key(b"anything", 10)));
    }

    #[test]
    fn keyless_records_stick_then_rotate() {
        let rr = RoundRobin::default();
        let picks: Vec<i32> = (0..STICK * 3).map(|_| rr.pick(3)).collect();
        assert!(picks[..STICK as usize].iter().all(|&p| p == 0));
        assert!(picks[STICK as usize..2 * STICK as usize].iter().all(|&p| p == 1));
        assert_eq!(rr.pick(0), 0, "a zero partition count does not divide by zero");
    }
}
