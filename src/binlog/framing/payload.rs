//! MySQL 8 TRANSACTION_PAYLOAD events (`binlog_transaction_compression=ON`): one event holding
//! a whole transaction, zstd-compressed, cut here into the events inside it.

use mysql_common::binlog::consts::EventType;
use mysql_common::binlog::events::{BinlogEventHeader, Event};

use crate::binlog::decode::DecodeError;

/// The events inside a MySQL 8 TRANSACTION_PAYLOAD event, in order: typically QUERY `BEGIN`,
/// TABLE_MAPs, row events and the XID (the GTID stays outside). The payload is decompressed
/// with mysql_common (`TransactionPayloadEvent::decompressed`, zstd or none) and cut into
/// events here: each inner event is read by its own header's size (mysql_common's
/// `EventStreamReader::read_decompressed` panics on an inner event cut short), without
/// checksums (MySQL WL#3549: inner events carry none).
///
/// The whole transaction is held in memory (compressed by the server's packet, decompressed
/// here); MySQL writes one payload event per transaction.
///
/// Errors ([`DecodeError::Payload`]): zstd failure, an inner event shorter than its header or
/// than the payload left, a decompressed size different from the event's uncompressed size
/// field, a FORMAT_DESCRIPTION / TRANSACTION_PAYLOAD / ROTATE inside. Never a partial list.
pub fn transaction_payload_events(ev: &Event) -> Result<Vec<Event>, DecodeError> {
    use mysql_common::binlog::events::TransactionPayloadEvent;
    use std::io::Read as _;
    let err = |m: String| DecodeError::Payload(m);
    check_payload_header(ev.data()).map_err(|m| err(format!("its header is unreadable: {m}")))?;
    let tpe: TransactionPayloadEvent<'_> = ev.read_event().map_err(|e| err(format!("its header is unreadable: {e}")))?;
    let announced = tpe.uncompressed_size();
    let mut reader = tpe.decompressed().map_err(|e| err(format!("{:?} decompression: {e}", tpe.algorithm())))?;
    let fde = {
        let fde = ev.fde().clone();
        let mut footer = fde.footer();
        footer.set_checksum_enabled(false);
        fde.with_footer(footer)
    };
    let mut events = Vec::new();
    let mut offset: u64 = 0;
    loop {
        let mut buf = vec![0u8; BinlogEventHeader::LEN];
        let mut got = 0;
        while got < buf.len() {
            match reader.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => {
                    return Err(err(format!("{:?} decompression failed at payload offset {}: {e}", tpe.algorithm(), offset + got as u64)))
                }
            }
        }
        if got == 0 {
            break;
        }
        if got < BinlogEventHeader::LEN {
            return Err(err(format!(
                "the payload ends inside an event header at offset {offset} ({got} of {} bytes)",
                BinlogEventHeader::LEN
            )));
        }
        let size = u32::from_le_bytes([buf[9], buf[10], buf[11], buf[12]]) as usize;
        let ty = buf[4];
        if size < BinlogEventHeader::LEN {
            return Err(err(format!("inner event at offset {offset} has length {size}, shorter than its header")));
        }
        if size as u64 > announced.saturating_sub(offset) {
            return Err(err(format!(
                "inner event at offset {offset} has length {size}, beyond the announced uncompressed size {announced}"
            )));
        }
        // Read the body without allocating its announced length first: `size` comes from the
        // payload itself (up to 4 GiB), the bytes actually there are what is allocated.
        let body = (size - BinlogEventHeader::LEN) as u64;
        let got = (&mut reader)
            .take(body)
            .read_to_end(&mut buf)
            .map_err(|e| err(format!("inner event at offset {offset} ({size} bytes) is cut short: {e}")))?;
        if got as u64 != body {
            return Err(err(format!(
                "inner event at offset {offset} ({size} bytes) is cut short: the payload ends after {got} of its body bytes"
            )));
        }
        if matches!(
            EventType::try_from(ty),
            Ok(EventType::FORMAT_DESCRIPTION_EVENT | EventType::TRANSACTION_PAYLOAD_EVENT | EventType::ROTATE_EVENT)
        ) {
            return Err(err(format!(
                "inner event at offset {offset} is a {:?}, which cannot be inside a payload",
                EventType::try_from(ty).unwrap()
            )));
        }
        events.push(Event::read(&fde, &buf[..]).map_err(|e| err(format!("inner event at offset {offset}: {e}")))?);
        offset += size as u64;
    }
    if offset != announced {
        return Err(err(format!("the payload holds {offset} bytes of events, the event announces {announced}")));
    }
    Ok(events)
}

/// A TRANSACTION_PAYLOAD header that mysql_common 0.37 would panic on ([`check_payload_header`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PayloadHeaderError {
    /// The header ends inside a field.
    #[error("the header ends inside a field")]
    EndsInField,
    /// The header ends inside a length-encoded integer.
    #[error("the header ends inside a length-encoded integer")]
    EndsInInteger,
    /// A length-encoded integer starting with 0xfb or 0xff.
    #[error("bad length-encoded integer (first byte {first:#04x})")]
    Lenenc {
        /// Its first byte.
        first: u8,
    },
    /// A compression type other than ZSTD (0) or NONE (255).
    #[error("compression type {alg} is neither ZSTD (0) nor NONE (255)")]
    Compression {
        /// The type read.
        alg: u64,
    },
    /// A field type above 255.
    #[error("field type {t} is not a header field")]
    FieldType {
        /// The type read.
        t: u64,
    },
    /// An unknown field whose length runs past the header.
    #[error("a field of {len} bytes runs past the header's {left} bytes")]
    PastEnd {
        /// The field's length, bytes.
        len: u64,
        /// Bytes left in the header.
        left: usize,
    },
}

/// Check the header fields of a TRANSACTION_PAYLOAD event body (`data`, checksum excluded)
/// the way mysql_common 0.37 reads them, before it does: it panics on a field type above 255,
/// a compression type other than ZSTD (0) or NONE (255), and an unknown field whose length
/// runs past the body (found by fuzzing). Errors say which; the rest (sizes against the body)
/// mysql_common checks itself.
pub fn check_payload_header(data: &[u8]) -> Result<(), PayloadHeaderError> {
    /// A length-encoded integer as mysql_common's `read_lenenc_int` reads it (0xfb and 0xff
    /// refused), or as `eat_lenenc_int` does (`lenient`: they are 0).
    fn lenenc(buf: &mut &[u8], lenient: bool) -> Result<u64, PayloadHeaderError> {
        let (&first, rest) = buf.split_first().ok_or(PayloadHeaderError::EndsInField)?;
        let n = match first {
            0..=0xfa => 0,
            0xfc => 2,
            0xfd => 3,
            0xfe => 8,
            _ if lenient => 0,
            _ => return Err(PayloadHeaderError::Lenenc { first }),
        };
        let bytes = rest.get(..n).ok_or(PayloadHeaderError::EndsInInteger)?;
        *buf = &rest[n..];
        Ok(if n == 0 {
            if first <= 0xfa {
                first as u64
            } else {
                0
            }
        } else {
            bytes.iter().rev().fold(0u64, |a, &b| (a << 8) | b as u64)
        })
    }
    let mut buf = data;
    while !buf.is_empty() {
        match lenenc(&mut buf, false)? {
            0 => return Ok(()),
            1 | 3 => {
                lenenc(&mut buf, false)?;
                lenenc(&mut buf, false)?;
            }
            2 => {
                lenenc(&mut buf, false)?;
                let alg = lenenc(&mut buf, false)?;
                if alg != 0 && alg != 255 {
                    return Err(PayloadHeaderError::Compression { alg });
                }
            }
            t if t > 255 => return Err(PayloadHeaderError::FieldType { t }),
            _ => {
                let len = lenenc(&mut buf, true)?;
                if len > buf.len() as u64 {
                    return Err(PayloadHeaderError::PastEnd { len, left: buf.len() });
                }
                buf = &buf[len as usize..];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TRANSACTION_PAYLOAD of a real MySQL 8 binlog unwraps into its inner events; a
    /// damaged or cut payload is an error, never a panic or a partial list.
    #[test]
    fn transaction_payload_unwraps_and_fails_loudly() {
        use mysql_common::binlog::consts::BinlogVersion;
        use mysql_common::binlog::BinlogFile;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test/transaction_compression.000001");
        let f = std::fs::File::open(path).unwrap();
        let file = BinlogFile::new(BinlogVersion::Version4, std::io::BufReader::new(f)).unwrap();
        let payload = file
            .map(|e| e.unwrap())
            .find(|e| e.header().event_type_raw() == EventType::TRANSACTION_PAYLOAD_EVENT as u8)
            .expect("a payload event");
        let inner = transaction_payload_events(&payload).unwrap();
        let types: Vec<u8> = inner.iter().map(|e| e.header().event_type_raw()).collect();
        assert_eq!(types.first(), Some(&(EventType::QUERY_EVENT as u8)), "{types:?}");
        assert_eq!(types.last(), Some(&(EventType::XID_EVENT as u8)), "{types:?}");
        assert!(types.contains(&(EventType::TABLE_MAP_EVENT as u8)) && types.contains(&(EventType::WRITE_ROWS_EVENT as u8)), "{types:?}");

        // Damage the zstd data (the payload is the tail of the event body).
        let mut bytes = Vec::new();
        payload.write(BinlogVersion::Version4, &mut bytes).unwrap();
        let body_end = bytes.len() - 4; // CRC32
        for at in [body_end - 3, body_end - 12, body_end / 2 + 10] {
            let mut b = bytes.clone();
            b[at] ^= 0x5a;
            let ev = Event::read(payload.fde(), &b[..]).unwrap();
            match transaction_payload_events(&ev) {
                Err(DecodeError::Payload(m)) => assert!(!m.is_empty()),
                other => panic!("damaged payload at byte {at}: {:?}", other.map(|v| v.len())),
            }
        }
    }
}
