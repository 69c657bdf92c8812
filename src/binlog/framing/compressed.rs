//! MariaDB compressed events (`log_bin_compress=ON`): QUERY_COMPRESSED and the compressed
//! row events (types 165-171), which mysql_common 0.37 does not read, turned into the plain
//! QUERY / row events they wrap.

use mysql_common::binlog::consts::EventType;
use mysql_common::binlog::events::{BinlogEventHeader, Event, EventData};
use mysql_common::proto::MySerialize;

use crate::binlog::decode::DecodeError;

/// The plain event type a MariaDB compressed event type wraps, or `None` for any other type.
///
/// From MariaDB's `Log_event_type` (sql/log_event.h): QUERY_COMPRESSED_EVENT (165) is a
/// QUERY_EVENT (2); WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT_V1 (166-168) are the v1 row
/// events (23-25); WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT (169-171) the v2 row events
/// (30-32). mysql_common 0.37 knows none of them (`read_data` returns `Ok(None)`).
pub fn mariadb_compressed_plain_type(raw: u8) -> Option<EventType> {
    Some(match raw {
        165 => EventType::QUERY_EVENT,
        166 => EventType::WRITE_ROWS_EVENT_V1,
        167 => EventType::UPDATE_ROWS_EVENT_V1,
        168 => EventType::DELETE_ROWS_EVENT_V1,
        169 => EventType::WRITE_ROWS_EVENT,
        170 => EventType::UPDATE_ROWS_EVENT,
        171 => EventType::DELETE_ROWS_EVENT,
        _ => return None,
    })
}

/// MariaDB's name of a compressed event type (`Log_event::get_type_str`), e.g.
/// `Write_rows_compressed_v1`; `Unknown` for other types.
pub fn mariadb_compressed_name(raw: u8) -> &'static str {
    match raw {
        165 => "Query_compressed",
        166 => "Write_rows_compressed_v1",
        167 => "Update_rows_compressed_v1",
        168 => "Delete_rows_compressed_v1",
        169 => "Write_rows_compressed",
        170 => "Update_rows_compressed",
        171 => "Delete_rows_compressed",
        _ => "Unknown",
    }
}

/// Turn a MariaDB compressed event (types 165-171, see [`mariadb_compressed_plain_type`]) into
/// the plain event it wraps, so that mysql_common parses it and binval decodes it exactly like
/// an uncompressed one. The returned event keeps the original header (time, server_id, log_pos)
/// with the plain type and the new size, and carries no checksum (the original one was checked
/// by the reader, over the compressed bytes).
///
/// Format, from MariaDB's sql/log_event.cc (`query_event_uncompress`,
/// `row_log_event_uncompress`, `binlog_buf_uncompress`, `binlog_get_uncompress_len`): only the
/// tail is compressed: the query text of a query event (after the status variables and the
/// schema name with its NUL), the row images of a row event (after the post-header, the
/// variable-length extra header of v2 events, the column count and the column bitmaps). The
/// compressed record is one header byte (bit 7 set; bits 4-6 the algorithm, 0 = zlib, the only
/// one defined; bits 0-2 the byte width, 1-4, of the length), the uncompressed length in that
/// many **big-endian** bytes, then a zlib stream.
///
/// The clear part is located by mysql_common itself: the event is first parsed with the plain
/// type (its query text / rows data then are the compressed record). No byte of the clear part
/// is parsed by binval.
///
/// Errors: [`DecodeError::Compressed`] naming the event and what is wrong; the caller adds the
/// binlog position. Never an empty or partial result.
pub fn uncompress_mariadb_event(ev: &Event) -> Result<Event, DecodeError> {
    let header = ev.header();
    let raw = header.event_type_raw();
    let event = mariadb_compressed_name(raw);
    let err = |detail: String| DecodeError::Compressed { event, detail };
    let plain = mariadb_compressed_plain_type(raw).ok_or_else(|| err(format!("event type {raw} is not a compressed event type")))?;
    let fde = {
        let fde = ev.fde().clone();
        let mut footer = fde.footer();
        footer.set_checksum_enabled(false);
        fde.with_footer(footer)
    };
    let data = ev.data();
    let framed = reframe(&fde, header, plain, data).map_err(|e| err(e.to_string()))?;
    let clear_len = match framed.read_data() {
        Ok(Some(EventData::QueryEvent(q))) => data.len() - q.query_raw().len(),
        Ok(Some(EventData::RowsEvent(r))) => data.len() - r.rows_data().len(),
        Ok(_) => return Err(err(format!("mysql_common does not read it as a {plain:?}"))),
        Err(e) => return Err(err(format!("its uncompressed part is unreadable: {e}"))),
    };
    let tail = uncompress_record(&data[clear_len..]).map_err(|e| err(e.to_string()))?;
    let mut plain_data = Vec::with_capacity(clear_len + tail.len());
    plain_data.extend_from_slice(&data[..clear_len]);
    plain_data.extend_from_slice(&tail);
    reframe(&fde, header, plain, &plain_data).map_err(|e| err(e.to_string()))
}

/// An event of type `ty` with the header fields of `header` and body `data`, read back by
/// mysql_common (`fde` must have checksums disabled: `data` carries none).
fn reframe(
    fde: &mysql_common::binlog::events::FormatDescriptionEvent<'static>,
    header: BinlogEventHeader,
    ty: EventType,
    data: &[u8],
) -> Result<Event, RecordError> {
    let size = BinlogEventHeader::LEN + data.len();
    let size32 = u32::try_from(size).map_err(|_| RecordError::TooLarge { size })?;
    let h = BinlogEventHeader::new(header.timestamp(), ty, header.server_id(), size32, header.log_pos(), header.flags());
    let mut buf = Vec::with_capacity(size);
    h.serialize(&mut buf);
    buf.extend_from_slice(data);
    Event::read(fde, &buf[..]).map_err(|source| RecordError::Rebuilt { ty, source })
}

/// Why a MariaDB compressed record cannot be turned back into its plain event; the text
/// becomes the `detail` of [`DecodeError::Compressed`].
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("the compressed record is empty")]
    Empty,
    #[error("record header byte {h:#04x} lacks the compressed flag 0x80")]
    NotCompressed { h: u8 },
    #[error("record header byte {h:#04x} names compression algorithm {alg}; MariaDB defines only 0 (zlib)")]
    Algorithm { h: u8, alg: u8 },
    #[error("record header byte {h:#04x} gives a {lenlen}-byte length; MariaDB writes 1 to 4")]
    LengthBytes { h: u8, lenlen: usize },
    #[error("record ends inside its {lenlen}-byte length")]
    EndsInLength { lenlen: usize },
    #[error("record announces an uncompressed length of 0")]
    ZeroLength,
    #[error("zlib data ({bytes} bytes) is corrupt: {source}")]
    Zlib { bytes: usize, source: std::io::Error },
    #[error("zlib data gives {got} bytes, the record header announces {announced}")]
    Length { got: usize, announced: usize },
    #[error("uncompressed event of {size} bytes exceeds the 4 GiB event size limit")]
    TooLarge { size: usize },
    #[error("rebuilt {ty:?} unreadable: {source}")]
    Rebuilt { ty: EventType, source: std::io::Error },
}

/// Decompress one MariaDB compressed record (see [`uncompress_mariadb_event`] for the format).
/// The result has exactly the announced length, or this is an error.
fn uncompress_record(rec: &[u8]) -> Result<Vec<u8>, RecordError> {
    use std::io::Read as _;
    let (&h, rest) = rec.split_first().ok_or(RecordError::Empty)?;
    if h & 0x80 == 0 {
        return Err(RecordError::NotCompressed { h });
    }
    let alg = (h & 0x70) >> 4;
    if alg != 0 {
        return Err(RecordError::Algorithm { h, alg });
    }
    let lenlen = (h & 0x07) as usize;
    if !(1..=4).contains(&lenlen) {
        return Err(RecordError::LengthBytes { h, lenlen });
    }
    if rest.len() < lenlen {
        return Err(RecordError::EndsInLength { lenlen });
    }
    let len = rest[..lenlen].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
    if len == 0 {
        return Err(RecordError::ZeroLength);
    }
    // The announced length (up to 4 GiB) only bounds the output: the buffer grows with the
    // bytes zlib actually gives, so a lying header cannot make binval allocate gigabytes.
    let mut out = Vec::with_capacity(len.min(1 << 16));
    flate2::read::ZlibDecoder::new(&rest[lenlen..])
        .take(len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|source| RecordError::Zlib { bytes: rest.len() - lenlen, source })?;
    if out.len() != len {
        return Err(RecordError::Length { got: out.len(), announced: len });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A MariaDB compressed record (`binlog_buf_compress`): header byte, big-endian length,
    /// zlib stream.
    fn record(plain: &[u8], lenlen: usize) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(plain).unwrap();
        let mut r = vec![0x80 | lenlen as u8];
        r.extend_from_slice(&(plain.len() as u32).to_be_bytes()[4 - lenlen..]);
        r.extend(z.finish().unwrap());
        r
    }

    #[test]
    fn compressed_records() {
        let small = b"0123456789".repeat(3);
        assert_eq!(uncompress_record(&record(&small, 1)).unwrap(), small);
        // Lengths are big-endian: 0x01_02 bytes must not be read as 0x02_01.
        let big = (0..0x0102u32).map(|i| i as u8).collect::<Vec<_>>();
        assert_eq!(uncompress_record(&record(&big, 2)).unwrap(), big);
        let huge = b"abc".repeat(100_000);
        assert_eq!(uncompress_record(&record(&huge, 3)).unwrap(), huge);
        assert_eq!(uncompress_record(&record(&huge, 4)).unwrap(), huge);

        let mut bad = record(&small, 1);
        bad[0] = 0x01;
        assert!(uncompress_record(&bad).unwrap_err().to_string().contains("lacks the compressed flag"));
        bad[0] = 0x91;
        assert!(uncompress_record(&bad).unwrap_err().to_string().contains("algorithm 1"));
        bad[0] = 0x85;
        assert!(uncompress_record(&bad).unwrap_err().to_string().contains("5-byte length"));
        let mut wrong_len = record(&small, 1);
        wrong_len[1] += 1;
        assert!(uncompress_record(&wrong_len).unwrap_err().to_string().contains("announces 31"));
        let mut corrupt = record(&huge, 3);
        let n = corrupt.len();
        corrupt[n - 2] ^= 0xff; // the zlib stream's Adler-32
        assert!(uncompress_record(&corrupt).unwrap_err().to_string().contains("corrupt"));
        let truncated = &record(&huge, 3)[..40];
        assert!(uncompress_record(truncated).is_err());
        assert!(uncompress_record(&[]).is_err());
        assert!(uncompress_record(&[0x82, 0x01]).unwrap_err().to_string().contains("ends inside"));
    }

    #[test]
    fn compressed_types() {
        assert_eq!(mariadb_compressed_plain_type(165), Some(EventType::QUERY_EVENT));
        assert_eq!(mariadb_compressed_plain_type(167), Some(EventType::UPDATE_ROWS_EVENT_V1));
        assert_eq!(mariadb_compressed_plain_type(171), Some(EventType::DELETE_ROWS_EVENT));
        assert_eq!(mariadb_compressed_plain_type(162), None);
        assert_eq!(mariadb_compressed_plain_type(23), None);
    }
}
