//! The partition librdkafka's producer gives a message key, computed binval-side.
//!
//! In the per-key format every event is produced with its logical key as the Kafka message key
//! and librdkafka picks the partition (its `partitioner` setting; default `consistent_random`:
//! CRC-32 of the key modulo the partition count). In the batched format binval puts the changes
//! of many keys into one message per partition, produced to an explicit partition, so it must
//! put each key exactly where librdkafka would have put its per-key event: then a key's changes
//! stay on one partition, in order, when binval switches formats mid-stream (an app reads each
//! key's events of both formats from the same partition). [`Partitioner`] is that function
//! for the deterministic partitioners librdkafka has (`tests` check it against librdkafka's
//! own functions for random keys); the `random` partitioner has no such mapping and is
//! refused for the batched format.

use crate::error::Error;

/// A deterministic librdkafka partitioner (the `partitioner` producer property).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioner {
    /// `consistent` and `consistent_random` (librdkafka's default): CRC-32 (IEEE) of the key.
    Crc32,
    /// `murmur2` and `murmur2_random` (the Java client's default): Kafka's murmur2 of the key,
    /// positive.
    Murmur2,
    /// `fnv1a` and `fnv1a_random`: 32-bit FNV-1a of the key, absolute value.
    Fnv1a,
}

impl Partitioner {
    /// The partitioner named by `kafka.properties.partitioner` (`None`: librdkafka's default,
    /// `consistent_random`). Errors name the property: `random` (no key mapping) and unknown
    /// names.
    pub fn from_property(name: Option<&str>) -> Result<Self, Error> {
        Ok(match name.map(str::trim) {
            None | Some("consistent_random") | Some("consistent") => Partitioner::Crc32,
            Some("murmur2_random") | Some("murmur2") => Partitioner::Murmur2,
            Some("fnv1a_random") | Some("fnv1a") => Partitioner::Fnv1a,
            Some(other) => {
                return Err(Error::config(
                    "kafka.properties.partitioner",
                    format!(
                        "`{other}` gives keys no fixed partition; kafka.event_format = \"batched\" needs one of consistent_random \
                         (the default), consistent, murmur2_random, murmur2, fnv1a_random, fnv1a"
                    ),
                ))
            }
        })
    }

    /// The partition of `key` among `partitions` (> 0) partitions, as librdkafka computes it.
    /// An empty key (librdkafka picks a random partition for it) goes to partition 0.
    pub fn partition(self, key: &[u8], partitions: i32) -> i32 {
        let n = partitions.max(1) as u32;
        if key.is_empty() {
            return 0;
        }
        let h = match self {
            Partitioner::Crc32 => crc32fast::hash(key),
            Partitioner::Murmur2 => murmur2(key) & 0x7fff_ffff,
            Partitioner::Fnv1a => fnv1a(key),
        };
        (h % n) as i32
    }
}

/// Kafka's murmur2 (seed `0x9747b28c`), as librdkafka's `rd_murmur2`.
fn murmur2(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ (key.len() as u32);
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// 32-bit FNV-1a, absolute value as a signed integer (librdkafka's `rd_fnv1a`, Sarama's).
fn fnv1a(key: &[u8]) -> u32 {
    let mut h: i32 = 0x811c_9dc5_u32 as i32;
    for &b in key {
        h ^= i32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.wrapping_abs() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;
    use std::ffi::c_void;

    type Librdkafka =
        unsafe extern "C" fn(*const rdkafka::bindings::rd_kafka_topic_t, *const c_void, usize, i32, *mut c_void, *mut c_void) -> i32;

    /// librdkafka's own function, for a non-empty key (the deterministic branch never touches
    /// the topic handle).
    fn theirs(f: Librdkafka, key: &[u8], n: i32) -> i32 {
        assert!(!key.is_empty());
        unsafe { f(std::ptr::null(), key.as_ptr() as *const c_void, key.len(), n, std::ptr::null_mut(), std::ptr::null_mut()) }
    }

    /// Each partitioner against librdkafka's for random keys (ASCII and arbitrary bytes, every
    /// tail length) and partition counts.
    #[test]
    fn matches_librdkafka() {
        use rdkafka::bindings as b;
        let cases: [(Partitioner, Librdkafka); 6] = [
            (Partitioner::Crc32, b::rd_kafka_msg_partitioner_consistent_random),
            (Partitioner::Crc32, b::rd_kafka_msg_partitioner_consistent),
            (Partitioner::Murmur2, b::rd_kafka_msg_partitioner_murmur2_random),
            (Partitioner::Murmur2, b::rd_kafka_msg_partitioner_murmur2),
            (Partitioner::Fnv1a, b::rd_kafka_msg_partitioner_fnv1a_random),
            (Partitioner::Fnv1a, b::rd_kafka_msg_partitioner_fnv1a),
        ];
        let mut rng = rand::rng();
        for i in 0..20_000 {
            let key: Vec<u8> = if i % 2 == 0 {
                format!("item:detail:{}", rng.random::<u32>()).into_bytes()
            } else {
                let len = rng.random_range(1..40);
                (0..len).map(|_| rng.random()).collect()
            };
            let n = [1, 2, 3, 7, 12, 64, 1000][i % 7];
            for (ours, f) in cases {
                assert_eq!(ours.partition(&key, n), theirs(f, &key, n), "{ours:?} key {key:?} partitions {n}");
            }
        }
    }

    #[test]
    fn property_names() {
        assert_eq!(Partitioner::from_property(None).unwrap(), Partitioner::Crc32);
        assert_eq!(Partitioner::from_property(Some("murmur2_random")).unwrap(), Partitioner::Murmur2);
        let e = Partitioner::from_property(Some("random")).unwrap_err().to_string();
        assert!(e.contains("kafka.properties.partitioner"), "{e}");
    }
}
